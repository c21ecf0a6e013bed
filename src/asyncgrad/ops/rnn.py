"""The recurrences of an LSTM and a GRU layer as one node each, over the whole sequence.

Note [One node per recurrence]: written with the elementwise ops, an LSTM step is a
dozen nodes (a product, a slice per gate, three sigmoids, two tanh, the products and
sums), each paying the recording and the engine's routing per step in both directions.
The input projection of every step is one product outside the recurrence
(``x @ W_ih^T + b``, an ordinary ``linear`` node); what is left is sequential: per step
one product with ``W_hh`` and the gates. So the recurrence of one layer and direction is
one node, as cuDNN's: its forward loops over the steps in numpy, and its backward is the
backward-through-time loop, in numpy, with the recurrent weight's gradient as one product
over all steps (``dz^T @ h_prev``) after the loop.

* LSTM (``lstm``): inputs ``(xg, h0, c0, w_hh)``, ``xg`` the projected input with both
  biases, ``(T, B, 4H)`` in PyTorch's gate order i, f, g, o. The output packs the hidden
  states and the last cell state in one array ``(T + 1, B, H)``: ``[:T]`` are
  ``h_1 .. h_T`` (at their input's time index, also for ``reverse``), ``[T]`` is the cell
  state after the last step.
* GRU (``gru``): inputs ``(xg, h0, w_hh, b_hh)``, ``xg = x @ W_ih^T + b_ih`` in gate order
  r, z, n; ``n = tanh(xn + r * (h @ W_hn^T + b_hn))`` as PyTorch, so ``b_hh`` stays
  separate. The output is ``(T, B, H)``.
* Elman RNN (``rnn``): inputs ``(xg, h0, w_hh)``, ``h_t = act(xg_t + h_{t-1} @ w_hh^T)``
  with ``act`` tanh or relu; the output is ``(T, B, H)``.

The forward keeps the gates' activations (aux) for the plain backward, which computes all
four gradients in one loop (the joint rule) or, when one input alone needs a gradient,
the same loop for it. Under create_graph the rules recompute the recurrence from the
saved inputs with the differentiable namespace ``m`` and run the same backward loop in
it, so a gradient of a gradient flows (``_lstm_composite`` / ``_gru_composite``, written with operators and
``m``'s functions only; a rule recomputes the whole loop for its one input, which only
create_graph pays).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._spec import OpSpec


def _sigmoid(m: Any, x: Any) -> Any:
    """The logistic function through tanh (no overflow for large ``-x``)."""
    return m.tanh(x * 0.5) * 0.5 + 0.5


def _order(steps: int, reverse: bool) -> range:
    return range(steps - 1, -1, -1) if reverse else range(steps)


def _previous(hs: Any, h0: Any, reverse: bool, m: Any) -> Any:
    """The hidden state each step read, ``(T, B, H)``, at the step's time index."""
    if hs.shape[0] == 1:
        return m.unsqueeze(h0, 0) if m.tensor_mode else h0[None]
    if reverse:
        return m.cat([hs[1:], m.unsqueeze(h0, 0) if m.tensor_mode else h0[None]], 0)
    return m.cat([m.unsqueeze(h0, 0) if m.tensor_mode else h0[None], hs[:-1]], 0)


# --- LSTM ---------------------------------------------------------------------------------------
def _lstm(xg, h0, c0, w, *, reverse):  # type: ignore[no-untyped-def]
    """The forward loop. Note [Gates through one tanh]: the gates are kept in the order
    i, f, o, g, the sigmoid gates' pre-activations halved (in the copy of ``xg`` and of
    ``w_hh``), so one ``tanh`` per step serves all four (``sigmoid(x) = tanh(x / 2) / 2 +
    1 / 2``) and one affine pass over the first three blocks finishes the sigmoids."""
    steps, batch, four = xg.shape
    hidden = four // 4
    h2, h3 = 2 * hidden, 3 * hidden
    acts = np.empty_like(xg)  # activations i, f, o, g (this order)
    np.multiply(xg[..., :h2], 0.5, out=acts[..., :h2])
    np.multiply(xg[..., h3:], 0.5, out=acts[..., h2:h3])
    acts[..., h3:] = xg[..., h2:h3]
    wt = np.empty((hidden, four), dtype=w.dtype)  # w_hh^T, permuted and halved as acts
    np.multiply(w[:h2].T, 0.5, out=wt[:, :h2])
    np.multiply(w[h3:].T, 0.5, out=wt[:, h2:h3])
    wt[:, h3:] = w[h2:h3].T
    out = np.empty((steps + 1, batch, hidden), dtype=xg.dtype)
    cells = np.empty((steps, batch, hidden), dtype=xg.dtype)
    tanh_cells = np.empty_like(cells)
    rec = np.empty((batch, four), dtype=xg.dtype)
    ig = np.empty((batch, hidden), dtype=xg.dtype)
    h, c = h0, c0
    for t in _order(steps, reverse):
        z = acts[t]
        np.matmul(h, wt, out=rec)
        z += rec
        np.tanh(z, out=z)
        s = z[:, :h3]
        s *= 0.5
        s += 0.5
        c_new = cells[t]
        np.multiply(z[:, hidden:h2], c, out=c_new)
        np.multiply(z[:, :hidden], z[:, h3:], out=ig)
        c_new += ig
        np.tanh(c_new, out=tanh_cells[t])
        np.multiply(z[:, h2:h3], tanh_cells[t], out=out[t])
        h, c = out[t], c_new
    out[steps] = c
    return out, (acts, cells, tanh_cells)


def _lstm_backward(g, ans, xg, h0, c0, w, reverse, aux):  # type: ignore[no-untyped-def]
    """All four gradients ``(dxg, dh0, dc0, dw)`` of the plain backward, in numpy.

    Only ``dh`` and ``dc`` are sequential: every factor that multiplies them (the gates'
    derivatives) is computed for all steps at once before the loop, which is then seven
    passes and one product per step. ``dz`` is in PyTorch's gate order i, f, g, o."""
    acts, cells, tanh_cells = aux
    steps, batch, four = acts.shape
    hidden = four // 4
    h2, h3 = 2 * hidden, 3 * hidden
    i, f, o, gg = acts[..., :hidden], acts[..., hidden:h2], acts[..., h2:h3], acts[..., h3:]
    c_prev = np.empty_like(cells)
    if reverse:
        c_prev[:-1] = cells[1:]
        c_prev[-1] = c0
    else:
        c_prev[1:] = cells[:-1]
        c_prev[0] = c0
    tc = tanh_cells
    keep = o * (1.0 - tc * tc)  # dc += dh * keep
    out_gate = tc * o * (1.0 - o)  # dz_o = dh * out_gate
    by_cell = np.empty((steps, batch, 3, hidden), dtype=acts.dtype)  # dz_{i,f,g} = dc * by_cell
    np.multiply(gg, i * (1.0 - i), out=by_cell[:, :, 0])
    np.multiply(c_prev, f * (1.0 - f), out=by_cell[:, :, 1])
    np.multiply(i, 1.0 - gg * gg, out=by_cell[:, :, 2])
    dz = np.empty((steps, batch, four), dtype=acts.dtype)
    dz4 = dz.reshape(steps, batch, 4, hidden)
    dh = np.empty((batch, hidden), dtype=acts.dtype)
    dh_next = np.zeros((batch, hidden), dtype=acts.dtype)
    tmp = np.empty_like(dh)
    dc = np.array(g[steps], dtype=acts.dtype)
    for t in reversed(_order(steps, reverse)):
        np.add(g[t], dh_next, out=dh)
        np.multiply(dh, keep[t], out=tmp)
        dc += tmp
        np.multiply(dc[:, None, :], by_cell[t], out=dz4[t, :, :3])
        np.multiply(dh, out_gate[t], out=dz4[t, :, 3])
        dc *= f[t]
        np.matmul(dz[t], w, out=dh_next)
    prev_h = _previous(ans[:steps], h0, reverse, _NP)
    dw = dz.reshape(-1, four).T @ prev_h.reshape(-1, hidden)
    return dz, dh_next, dc, dw


def _lstm_composite(m, g, xg, h0, c0, w, reverse):  # type: ignore[no-untyped-def]
    """The forward and the backward loop in the namespace ``m`` (create_graph)."""
    steps = xg.shape[0]
    hidden = w.shape[1]
    order = list(_order(steps, reverse))
    acts = {}
    h, c = h0, c0
    for t in order:
        z = xg[t] + m.matmul(h, m.transpose(w, 0, 1))
        i = _sigmoid(m, z[:, :hidden])
        f = _sigmoid(m, z[:, hidden:2 * hidden])
        gg = m.tanh(z[:, 2 * hidden:3 * hidden])
        o = _sigmoid(m, z[:, 3 * hidden:])
        c_prev = c
        c = f * c + i * gg
        tc = m.tanh(c)
        h_prev = h
        h = o * tc
        acts[t] = (i, f, gg, o, tc, c_prev, h_prev)
    dzs = {}
    dh_next = None
    dc = g[steps]
    dw = None
    for t in reversed(order):
        i, f, gg, o, tc, c_prev, h_prev = acts[t]
        dh = g[t] if dh_next is None else g[t] + dh_next
        do = dh * tc * o * (1.0 - o)
        dc = dc + dh * o * (1.0 - tc * tc)
        d = m.cat([dc * gg * i * (1.0 - i), dc * c_prev * f * (1.0 - f), dc * i * (1.0 - gg * gg), do], 1)
        dzs[t] = d
        dc = dc * f
        dh_next = m.matmul(d, w)
        step_dw = m.matmul(m.transpose(d, 0, 1), h_prev)
        dw = step_dw if dw is None else dw + step_dw
    dxg = m.stack([dzs[t] for t in range(steps)], 0)
    return dxg, dh_next, dc, dw


def _lstm_rule(index: int):  # type: ignore[no-untyped-def]
    def rule(m, g, ans, xg, h0, c0, w, *, reverse, aux):  # type: ignore[no-untyped-def]
        if m.tensor_mode:
            return _lstm_composite(m, g, xg, h0, c0, w, reverse)[index]
        return _lstm_backward(g, ans, xg, h0, c0, w, reverse, aux)[index]
    return rule


def _lstm_joint(g, ans, xg, h0, c0, w, *, mask, reverse, aux):  # type: ignore[no-untyped-def]
    grads = _lstm_backward(g, ans, xg, h0, c0, w, reverse, aux)
    return tuple(d if need else None for d, need in zip(grads, mask))


# --- GRU ----------------------------------------------------------------------------------------
def _gru(xg, h0, w, b, *, reverse):  # type: ignore[no-untyped-def]
    steps, batch, three = xg.shape
    hidden = three // 3
    out = np.empty((steps, batch, hidden), dtype=xg.dtype)
    gates = np.empty_like(xg)  # activations r, z, n
    hn = np.empty((steps, batch, hidden), dtype=xg.dtype)  # h @ W_hn^T + b_hn
    hg = np.empty((batch, three), dtype=xg.dtype)
    wt = np.ascontiguousarray(w.T)
    h = h0
    for t in _order(steps, reverse):
        np.matmul(h, wt, out=hg)
        hg += b
        a = gates[t]
        x = xg[t]
        rz = a[:, :2 * hidden]
        np.add(x[:, :2 * hidden], hg[:, :2 * hidden], out=rz)
        rz *= 0.5
        np.tanh(rz, out=rz)
        rz *= 0.5
        rz += 0.5
        hn[t] = hg[:, 2 * hidden:]
        n = a[:, 2 * hidden:]
        np.multiply(a[:, :hidden], hn[t], out=n)
        n += x[:, 2 * hidden:]
        np.tanh(n, out=n)
        zz = a[:, hidden:2 * hidden]
        # h' = n + z * (h - n)
        h_new = out[t]
        np.subtract(h, n, out=h_new)
        h_new *= zz
        h_new += n
        h = h_new
    return out, (gates, hn)


def _gru_backward(g, ans, xg, h0, w, b, reverse, aux):  # type: ignore[no-untyped-def]
    """All four gradients ``(dxg, dh0, dw, db)`` of the plain backward, in numpy."""
    gates, hn = aux
    steps, batch, three = gates.shape
    hidden = three // 3
    dx = np.empty_like(gates)
    dhg = np.empty_like(gates)
    dh_next = None
    for t in reversed(_order(steps, reverse)):
        prev = (t + 1 if reverse else t - 1)
        h_prev = h0 if prev < 0 or prev >= steps else ans[prev]
        a = gates[t]
        r, z, n = a[:, :hidden], a[:, hidden:2 * hidden], a[:, 2 * hidden:]
        dh = g[t] if dh_next is None else g[t] + dh_next
        dn = dx[t, :, 2 * hidden:]
        np.multiply(dh, 1.0 - z, out=dn)
        dn *= 1.0 - n * n
        np.multiply(dn, hn[t], out=dx[t, :, :hidden])
        dx[t, :, :hidden] *= r * (1.0 - r)
        np.subtract(h_prev, n, out=dx[t, :, hidden:2 * hidden])
        dx[t, :, hidden:2 * hidden] *= dh
        dx[t, :, hidden:2 * hidden] *= z * (1.0 - z)
        d = dhg[t]
        d[:, :2 * hidden] = dx[t, :, :2 * hidden]
        np.multiply(dn, r, out=d[:, 2 * hidden:])
        dh_next = dh * z
        dh_next += d @ w
    prev_h = _previous(ans, h0, reverse, _NP)
    flat = dhg.reshape(-1, three)
    dw = flat.T @ prev_h.reshape(-1, hidden)
    db = flat.sum(axis=0)
    return dx, dh_next, dw, db


def _gru_composite(m, g, xg, h0, w, b, reverse):  # type: ignore[no-untyped-def]
    """The forward and the backward loop in the namespace ``m`` (create_graph)."""
    steps = xg.shape[0]
    hidden = w.shape[1]
    order = list(_order(steps, reverse))
    acts = {}
    h = h0
    for t in order:
        hg = m.matmul(h, m.transpose(w, 0, 1)) + b
        x = xg[t]
        r = _sigmoid(m, x[:, :hidden] + hg[:, :hidden])
        z = _sigmoid(m, x[:, hidden:2 * hidden] + hg[:, hidden:2 * hidden])
        hn = hg[:, 2 * hidden:]
        n = m.tanh(x[:, 2 * hidden:] + r * hn)
        acts[t] = (r, z, n, hn, h)
        h = n + z * (h - n)
    dxs = {}
    dh_next = None
    dw = None
    db = None
    for t in reversed(order):
        r, z, n, hn, h_prev = acts[t]
        dh = g[t] if dh_next is None else g[t] + dh_next
        dn = dh * (1.0 - z) * (1.0 - n * n)
        dr = dn * hn * r * (1.0 - r)
        dz = dh * (h_prev - n) * z * (1.0 - z)
        dxs[t] = m.cat([dr, dz, dn], 1)
        d = m.cat([dr, dz, dn * r], 1)
        dh_next = dh * z + m.matmul(d, w)
        step_dw = m.matmul(m.transpose(d, 0, 1), h_prev)
        step_db = m.sum(d, 0)
        dw = step_dw if dw is None else dw + step_dw
        db = step_db if db is None else db + step_db
    dxg = m.stack([dxs[t] for t in range(steps)], 0)
    return dxg, dh_next, dw, db


def _gru_rule(index: int):  # type: ignore[no-untyped-def]
    def rule(m, g, ans, xg, h0, w, b, *, reverse, aux):  # type: ignore[no-untyped-def]
        if m.tensor_mode:
            return _gru_composite(m, g, xg, h0, w, b, reverse)[index]
        return _gru_backward(g, ans, xg, h0, w, b, reverse, aux)[index]
    return rule


def _gru_joint(g, ans, xg, h0, w, b, *, mask, reverse, aux):  # type: ignore[no-untyped-def]
    grads = _gru_backward(g, ans, xg, h0, w, b, reverse, aux)
    return tuple(d if need else None for d, need in zip(grads, mask))


# --- Elman RNN (tanh or relu) ------------------------------------------------------------------
def _rnn(xg, h0, w, *, nonlinearity, reverse):  # type: ignore[no-untyped-def]
    """``h_t = act(xg_t + h_{t-1} @ w^T)``; ``xg`` holds both biases."""
    steps, batch, hidden = xg.shape
    out = np.empty_like(xg)
    wt = np.ascontiguousarray(w.T)
    rec = np.empty((batch, hidden), dtype=xg.dtype)
    h = h0
    for t in _order(steps, reverse):
        np.matmul(h, wt, out=rec)
        h_new = out[t]
        np.add(xg[t], rec, out=h_new)
        if nonlinearity == "tanh":
            np.tanh(h_new, out=h_new)
        else:
            np.maximum(h_new, 0.0, out=h_new)
        h = h_new
    return out


def _rnn_backward(g, ans, h0, w, nonlinearity, reverse):  # type: ignore[no-untyped-def]
    """The three gradients ``(dxg, dh0, dw)`` of the plain backward, in numpy."""
    steps, batch, hidden = ans.shape
    slope = 1.0 - ans * ans if nonlinearity == "tanh" else (ans > 0).astype(ans.dtype)
    dz = np.empty_like(ans)
    dh_next = np.zeros((batch, hidden), dtype=ans.dtype)
    for t in reversed(_order(steps, reverse)):
        np.add(g[t], dh_next, out=dz[t])
        dz[t] *= slope[t]
        np.matmul(dz[t], w, out=dh_next)
    prev_h = _previous(ans, h0, reverse, _NP)
    dw = dz.reshape(-1, hidden).T @ prev_h.reshape(-1, hidden)
    return dz, dh_next, dw


def _rnn_composite(m, g, xg, h0, w, nonlinearity, reverse):  # type: ignore[no-untyped-def]
    """The forward and the backward loop in the namespace ``m`` (create_graph)."""
    steps = xg.shape[0]
    order = list(_order(steps, reverse))
    hs, prevs = {}, {}
    h = h0
    for t in order:
        pre = xg[t] + m.matmul(h, m.transpose(w, 0, 1))
        prevs[t] = h
        h = m.tanh(pre) if nonlinearity == "tanh" else m.threshold_backward(pre, pre)  # relu(pre)
        hs[t] = h
    dzs = {}
    dh_next = None
    dw = None
    for t in reversed(order):
        dh = g[t] if dh_next is None else g[t] + dh_next
        h = hs[t]
        d = dh * (1.0 - h * h) if nonlinearity == "tanh" else m.threshold_backward(dh, h)
        dzs[t] = d
        dh_next = m.matmul(d, w)
        step_dw = m.matmul(m.transpose(d, 0, 1), prevs[t])
        dw = step_dw if dw is None else dw + step_dw
    return m.stack([dzs[t] for t in range(steps)], 0), dh_next, dw


def _rnn_rule(index: int):  # type: ignore[no-untyped-def]
    def rule(m, g, ans, xg, h0, w, *, nonlinearity, reverse):  # type: ignore[no-untyped-def]
        if m.tensor_mode:
            return _rnn_composite(m, g, xg, h0, w, nonlinearity, reverse)[index]
        return _rnn_backward(g, ans, h0, w, nonlinearity, reverse)[index]
    return rule


def _rnn_joint(g, ans, xg, h0, w, *, mask, nonlinearity, reverse):  # type: ignore[no-untyped-def]
    grads = _rnn_backward(g, ans, h0, w, nonlinearity, reverse)
    return tuple(d if need else None for d, need in zip(grads, mask))


class _NumpyMath:
    """The few names ``_previous`` needs, for arrays."""
    tensor_mode = False
    cat = staticmethod(np.concatenate)


_NP = _NumpyMath()

# every input saved (the backward loop reads all of them), and the output (the hidden states)
lstm = OpSpec("LstmBackward0", _lstm, tuple(_lstm_rule(i) for i in range(4)), save_inputs=(0, 1, 2, 3),
              save_ans=True, has_aux=True, blas=True, joint=_lstm_joint)
rnn = OpSpec("RnnBackward0", _rnn, tuple(_rnn_rule(i) for i in range(3)), save_inputs=(0, 1, 2),
             save_ans=True, blas=True, joint=_rnn_joint)
gru = OpSpec("GruBackward0", _gru, tuple(_gru_rule(i) for i in range(4)), save_inputs=(0, 1, 2, 3),
             save_ans=True, has_aux=True, blas=True, joint=_gru_joint)
