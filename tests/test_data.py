"""ag.utils.data: batching, collation, shuffling determinism, samplers and random_split."""

from collections import namedtuple

import numpy as np
import pytest

import asyncgrad as ag
from asyncgrad.utils.data import (
    BatchSampler, ConcatDataset, DataLoader, Dataset, IterableDataset, RandomSampler, SequentialSampler,
    TensorDataset, default_collate, random_split,
)


def _dataset(n=10):
    return TensorDataset(ag.arange(n), ag.tensor(np.arange(3 * n, dtype=np.float64).reshape(n, 3)))


def test_batches_in_order_with_the_last_short_or_dropped():
    ds = _dataset()
    loader = DataLoader(ds, batch_size=4)
    batches = list(loader)
    assert len(loader) == len(batches) == 3
    assert [b[0].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert isinstance(batches[0], list) and batches[0][1].shape == (4, 3)  # a list, as PyTorch's
    np.testing.assert_array_equal(batches[2][1].numpy(), ds.tensors[1].numpy()[8:])
    dropped = DataLoader(ds, batch_size=4, drop_last=True)
    assert len(dropped) == 2 and [b[0].tolist() for b in dropped] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_shuffle_is_reproducible_with_a_generator_and_new_each_epoch():
    ds = _dataset(20)
    order = lambda loader: [i for b in loader for i in b[0].tolist()]  # noqa: E731
    a = DataLoader(ds, batch_size=6, shuffle=True, generator=ag.Generator().manual_seed(7))
    b = DataLoader(ds, batch_size=6, shuffle=True, generator=ag.Generator().manual_seed(7))
    first, second = order(a), order(a)
    assert first == order(b) and second == order(b)
    assert sorted(first) == list(range(20)) and first != second and first != list(range(20))
    ag.manual_seed(3)  # without a generator: the default one
    c = order(DataLoader(ds, batch_size=6, shuffle=True))
    ag.manual_seed(3)
    assert order(DataLoader(ds, batch_size=6, shuffle=True)) == c


def test_default_collate_matches_torch_types():
    Point = namedtuple("Point", "x y")
    batch = default_collate([{"a": 1, "b": 2.5, "c": np.ones(2, np.float32), "s": "u", "p": Point(1, 2.0)},
                             {"a": 2, "b": 3.5, "c": np.zeros(2, np.float32), "s": "v", "p": Point(3, 4.0)}])
    assert batch["a"].dtype == np.int64 and batch["a"].tolist() == [1, 2]
    assert batch["b"].dtype == np.float64 and batch["c"].dtype == np.float32 and batch["c"].shape == (2, 2)
    assert batch["s"] == ["u", "v"]
    assert isinstance(batch["p"], Point) and batch["p"].x.tolist() == [1, 3]
    assert default_collate([True, False]).dtype == np.bool_
    with pytest.raises(RuntimeError, match="each element in list of batch should be of equal size"):
        default_collate([[1, 2], [1]])
    with pytest.raises(TypeError, match="default_collate: batch must contain"):
        default_collate([object(), object()])


def test_collate_agrees_with_torch():
    torch = pytest.importorskip("torch")
    samples = [(np.full(2, i, dtype=np.float64), i, float(i)) for i in range(5)]
    mine = list(DataLoader(samples, batch_size=2))
    theirs = list(torch.utils.data.DataLoader(samples, batch_size=2))
    assert len(mine) == len(theirs)
    for m, t in zip(mine, theirs):
        assert type(m) is type(t) is list
        for a, b in zip(m, t):
            assert a.dtype == np.dtype(str(b.dtype).removeprefix("torch."))
            np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_batch_size_none_custom_collate_and_samplers():
    ds = [np.arange(2) + i for i in range(3)]
    single = list(DataLoader(ds, batch_size=None))
    assert all(isinstance(s, ag.Tensor) for s in single) and single[2].tolist() == [2, 3]
    joined = list(DataLoader(ds, batch_size=2, collate_fn=lambda b: [x.sum() for x in b]))
    assert joined == [[1, 3], [5]]
    sampler = BatchSampler(SequentialSampler(range(7)), 3, drop_last=False)
    assert list(sampler) == [[0, 1, 2], [3, 4, 5], [6]] and len(sampler) == 3
    loader = DataLoader(range(7), batch_sampler=sampler)
    assert [b.tolist() for b in loader] == [[0, 1, 2], [3, 4, 5], [6]]
    drawn = list(RandomSampler(range(5), replacement=True, num_samples=12, generator=ag.Generator().manual_seed(0)))
    assert len(drawn) == 12 and set(drawn) <= set(range(5))
    assert len(list(DataLoader(ds, num_workers=2))) == 3  # loads in-process


def test_iterable_dataset_and_custom_map_dataset():
    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(5))

    assert [b.tolist() for b in DataLoader(Stream(), batch_size=2)] == [[0, 1], [2, 3], [4]]

    class Squares(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return {"x": float(i), "y": i * i}

    out = list(DataLoader(Squares(), batch_size=3))
    assert out[0]["y"].tolist() == [0, 1, 4] and out[1]["x"].tolist() == [3.0]
    both = ConcatDataset([Squares(), Squares()])
    assert len(both) == 8 and both[5]["y"] == 1 and both[-1]["y"] == 9


def test_random_split_counts_fractions_and_reproducibility():
    parts = random_split(range(10), [3, 7], generator=ag.Generator().manual_seed(1))
    again = random_split(range(10), [3, 7], generator=ag.Generator().manual_seed(1))
    assert [len(p) for p in parts] == [3, 7]
    assert sorted(list(parts[0]) + list(parts[1])) == list(range(10))
    assert list(parts[0]) == list(again[0])
    assert [len(p) for p in random_split(range(10), [0.25, 0.75])] == [3, 7]
    with pytest.raises(ValueError, match="Sum of input lengths does not equal the length"):
        random_split(range(10), [3, 3])


def test_errors():
    with pytest.raises(AssertionError, match="Size mismatch between tensors"):
        TensorDataset(ag.zeros(3), ag.zeros(4))
    with pytest.raises(ValueError, match="sampler option is mutually exclusive with shuffle"):
        DataLoader(range(3), sampler=SequentialSampler(range(3)), shuffle=True)
    with pytest.raises(ValueError, match="batch_size should be a positive integer value"):
        DataLoader(range(3), batch_size=0)
    with pytest.raises(ValueError, match="num_workers option should be non-negative"):
        DataLoader(range(3), num_workers=-1)
