"""Batched back-propagation of the output factors through plain sequential networks.

Hand-written (BackPACK also back-propagates module by module, but one factor at a time and with
its own per-module extensions; no maintained library batches the ``K`` factors and keeps only
activation cotangents). ``Capture`` back-propagates the ``K`` output factors (``K = C - 1`` for
the exact classification GGN) with ``K`` autograd passes through the graph of one forward. For
an ``nn.Sequential`` (nested ones flattened) of known modules, ``Chain`` instead runs the forward
without an autograd graph, keeping only what each module's backward needs (ReLU masks, max-pool
indices, module inputs), and back-propagates all ``K`` factors at once as one batch of ``N K``
cotangents, sample-major (``[N, K, *features]``): one ``conv_transpose2d`` of ``N K`` images
instead of ``K`` of ``N``, masks broadcast over ``K``, no weight gradients, no graph bookkeeping,
and nothing below the first module with parameters in the subset. The result is the same
``Record`` / ``Call`` list ``Capture`` produces (one call per module, ``call.grad`` a
``[K, N, *out]`` view of sample-major memory), so the structures do not know which path ran.

Measured on LeNet-5 / CPU (``benchmarks/fit.py``, profile in benchmarks/README.md): the ``K = 9``
autograd passes were ~50% of an exact-GGN fit, half of that conv2's input gradient. Besides
batching, four things are LeNet-shaped but general:

- ReLU directly followed by MaxPool2d is evaluated as max-pool then ReLU (identical output: ReLU
  is monotone), so the ReLU and its mask touch a 4x smaller tensor.
- A non-overlapping max-pool (kernel == stride, no padding) takes the elementwise maximum of its
  ``kh kw`` strided sub-grids and the first maximal one in row-major order (``max_pool2d``'s tie
  rule): ~1.5-2x faster than ``F.max_pool2d(return_indices=True)`` on CPU.
- A Conv2d of the subset followed by such a pool keeps its gradient compressed (``Call.pooled``:
  the pool's values and indices, a quarter of the dense ``[K, N, C, H, W]``), which the kernels in
  ``modules`` use directly (diag: gathered per-channel patches, 4x fewer multiply-adds; KFAC
  ``G``: no ``[N, K, C, H, W]`` scatter); for KFAC a later conv's gradient instead stays in 2x2-block
  order (``Call.s2d``), which sums over positions do not mind. ``call.grad`` scatters either form
  into the dense tensor on access.
- A stride-1 Conv2d with fewer than 16 input channels back-propagates through a 2x2
  space-to-depth transposed conv (``_conv_backward_s2d``): oneDNN pads output channels to 16, and
  ``4 C_in`` block channels waste less of it.

Supported leaves: ``Linear``, ``Conv2d`` (``modules.is_kfac_module``), ``ReLU``, ``Tanh``,
``Sigmoid``, the elementwise activations in ``_ELEMENTWISE`` (derivative from autograd during the
forward, no graph kept), ``MaxPool2d``, ``Flatten``, ``Identity`` and ``Dropout`` in eval mode;
every module with parameters must be a ``Linear`` or ``Conv2d`` leaf; no module may have hooks.
Otherwise ``Chain.build`` returns ``None`` and the caller uses ``Capture`` (autograd).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as _module

from laplace_lab.laplace.capture import Call, Record
from laplace_lab.laplace.modules import is_kfac_module

# elementwise activations whose derivative is taken from autograd in the forward
_ELEMENTWISE = (nn.LeakyReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Softplus, nn.Mish, nn.CELU, nn.SELU,
                nn.Hardtanh, nn.ReLU6, nn.Hardswish, nn.Hardsigmoid, nn.LogSigmoid, nn.Softsign,
                nn.Tanhshrink)


def _leaves(m: nn.Module) -> list[nn.Module] | None:
    if isinstance(m, nn.Sequential) and type(m).forward is nn.Sequential.forward:
        out = []
        for c in m:
            sub = _leaves(c)
            if sub is None:
                return None
            out += sub
        return out
    return [m]


def _has_hooks(m: nn.Module) -> bool:
    return any(bool(getattr(x, name, None)) for x in m.modules()
               for name in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"))


def _kind(m: nn.Module) -> str | None:
    t = type(m)
    if t is nn.Linear:
        return "linear"
    if t is nn.Conv2d and is_kfac_module(m):
        return "conv"
    if t is nn.ReLU:
        return "relu"
    if t is nn.Tanh:
        return "tanh"
    if t is nn.Sigmoid:
        return "sigmoid"
    if t in _ELEMENTWISE:
        return "act"
    if t is nn.MaxPool2d and not m.return_indices:
        return "pool"
    if t is nn.Flatten and m.start_dim >= 1:  # keeps the batch dimension
        return "view"
    if t is nn.Identity:
        return "id"
    if t in (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.AlphaDropout) and not m.training:
        return "id"
    return None


def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else tuple(v)


_FUSED = "fused into the next max-pool"


def _simple_pool(m: nn.MaxPool2d) -> bool:
    """Non-overlapping windows, no padding / dilation / ceil mode (kernel == stride)."""
    k = _pair(m.kernel_size)
    return (_pair(m.stride if m.stride is not None else m.kernel_size) == k and _pair(m.padding) == (0, 0)
            and _pair(m.dilation) == (1, 1) and not m.ceil_mode)


class Chain:
    """Forward / batched backward of a supported sequential model (see the module docstring)."""

    def __init__(self, leaves: list[nn.Module], kinds: list[str], entry_modules: list[nn.Module],
                 block_order_ok: bool = False):
        self.leaves, self.kinds = leaves, kinds
        # whether the consumers of call.grad only sum over spatial positions (KFAC factors), so a
        # conv's gradient may stay in 2x2-block order (Call.s2d) instead of being scattered again
        self.block_order_ok = block_order_ok
        self.entry_modules = entry_modules
        pos = {id(m): i for i, m in enumerate(leaves)}
        self.entry_pos = [pos[id(m)] for m in entry_modules]
        self.first = min(self.entry_pos)
        # leaf index -> (copy of its conv weight, that weight in space-to-depth form): reused while
        # the weight equals the copy. Compared by value, since neither the version counter
        # (``w.data.copy_`` leaves it as it is) nor id / address (reused once freed) tells a change.
        self._s2d_weights: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    @classmethod
    def build(cls, model: nn.Module, entry_modules: list[nn.Module], block_order_ok: bool = False) -> Chain | None:
        """A ``Chain`` for ``model`` if every leaf is supported (see module doc), else ``None``."""
        if _module._global_forward_hooks or _module._global_forward_pre_hooks or _has_hooks(model):
            return None
        leaves = _leaves(model)
        if not leaves:
            return None
        kinds = [_kind(m) for m in leaves]
        if any(k is None for k in kinds):
            return None
        if len({id(m) for m in leaves}) != len(leaves):  # a module used twice
            return None
        ids = {id(m) for m in leaves}
        if any(id(m) not in ids or not is_kfac_module(m) for m in entry_modules):
            return None
        for m, k in zip(leaves, kinds):  # only Linear / Conv2d may hold parameters
            if k not in ("linear", "conv") and any(True for _ in m.parameters()):
                return None
        return cls(leaves, kinds, entry_modules, block_order_ok)

    # ------------------------------------------------------------------------------------ forward
    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, list[Record]]:
        """Network output and one ``Record`` per entry module (its input recorded, no grads yet)."""
        leaves, kinds = self.leaves, self.kinds
        self._state: list = [None] * len(leaves)
        calls: dict[int, Call] = {}
        i = 0
        while i < len(leaves):
            m, k = leaves[i], kinds[i]
            if k == "linear":
                out = F.linear(x, m.weight, m.bias)
                calls[i] = Call((x,), {}, out)
                self._state[i] = x.shape
            elif k == "conv" and self._s2d_forward_ok(i, x):
                # conv -> [ReLU] -> 2x2 max-pool on 2x2 blocks: the pool is a max over 4 contiguous slabs
                j = i + 1 if kinds[i + 1] == "pool" else i + 2
                z, pooled, idx = _conv_pool_s2d(m, x, self._s2d_weight_of(i))
                calls[i] = Call((x,), {}, None, output_fn=z, out_shape=torch.Size((x.shape[0], m.out_channels,
                                                                                   x.shape[2] - m.kernel_size[0] + 1,
                                                                                   x.shape[3] - m.kernel_size[1] + 1)))
                self._state[i] = x.shape
                out, mask = pooled, None
                if j == i + 2:  # the ReLU between conv and pool, applied after the pool (monotone)
                    out = pooled.relu()
                    mask = out > 0
                    self._state[i + 1] = _FUSED
                self._state[j] = (calls[i].out_shape, idx, mask)
                x = out
                i = j + 1
                continue
            elif k == "conv":
                out = F.conv2d(x, m.weight, m.bias, m.stride, m.padding, m.dilation, m.groups)
                calls[i] = Call((x,), {}, out)
                self._state[i] = x.shape
            elif k == "relu" and i + 1 < len(leaves) and kinds[i + 1] == "pool":
                pooled, idx = self.max_pool(leaves[i + 1], x)
                out = pooled.relu()
                self._state[i] = _FUSED  # backward of both at i + 1
                self._state[i + 1] = (x.shape, idx, out > 0)
                i += 2
                x = out
                continue
            elif k == "pool":
                out, idx = self.max_pool(m, x)
                self._state[i] = (x.shape, idx, None)
            elif k == "relu":
                out = x.relu()
                self._state[i] = out > 0
            elif k == "tanh":
                out = x.tanh()
                self._state[i] = 1 - out.square()
            elif k == "sigmoid":
                out = x.sigmoid()
                self._state[i] = out * (1 - out)
            elif k == "act":
                xr = x.detach().requires_grad_(True)
                with torch.enable_grad():
                    y = m(xr + 0)  # + 0: an in-place activation may not write into a leaf
                    (d,) = torch.autograd.grad(y, xr, torch.ones_like(y))
                out = y.detach()
                self._state[i] = d
            elif k == "view":
                out = m(x)
                self._state[i] = x.shape
            else:  # identity
                out = x
            x = out
            i += 1
        self._calls = calls
        records = [Record(m, [calls[p]]) for m, p in zip(self.entry_modules, self.entry_pos)]
        return x, records

    def _s2d_weight_of(self, i: int) -> torch.Tensor:
        """Leaf ``i``'s conv weight in space-to-depth form (``_s2d_weight``), recomputed when the
        weight's value, dtype or device differ from the last call's."""
        w = self.leaves[i].weight.detach()
        hit = self._s2d_weights.get(i)
        if (hit is None or hit[0].dtype != w.dtype or hit[0].device != w.device or hit[0].shape != w.shape
                or not torch.equal(hit[0], w)):
            hit = self._s2d_weights[i] = (w.clone(), _s2d_weight(w))
        return hit[1]

    def _s2d_forward_ok(self, i: int, x: torch.Tensor) -> bool:
        """Conv ``i`` (few output channels) -> [ReLU] -> 2x2 / 2 max-pool: ``_conv_pool_s2d``."""
        kinds, leaves = self.kinds, self.leaves
        j = i + 1 if i + 1 < len(kinds) and kinds[i + 1] == "pool" else i + 2
        if j >= len(kinds) or kinds[j] != "pool" or (j == i + 2 and kinds[i + 1] != "relu"):
            return False
        pool, m = leaves[j], leaves[i]
        return (_simple_pool(pool) and _pair(pool.kernel_size) == (2, 2) and x.dim() == 4
                and m.out_channels < 16 and _s2d_ok(m, x.shape))

    @staticmethod
    def max_pool(m: nn.MaxPool2d, x: torch.Tensor):
        """``(pooled, idx)`` as ``F.max_pool2d(..., return_indices=True)``. Non-overlapping windows
        without padding (kernel == stride, the usual 2x2 / 2): elementwise maxima of the ``kh kw``
        strided sub-grids and the first maximal one in row-major order (max_pool2d's tie rule),
        ~5x faster than max_pool2d on CPU for LeNet's first pool (measured)."""
        kh, kw = _pair(m.kernel_size)
        if not _simple_pool(m) or x.dim() != 4:
            return F.max_pool2d(x, m.kernel_size, m.stride, m.padding, m.dilation, m.ceil_mode, return_indices=True)
        N, C, H, W = x.shape
        Ho, Wo = H // kh, W // kw
        parts = [x[:, :, i:Ho * kh:kh, j:Wo * kw:kw] for i in range(kh) for j in range(kw)]
        pooled = parts[0]
        for t in parts[1:]:
            pooled = torch.maximum(pooled, t)
        # idx = window origin + offset of the first maximal element: walk the window in row-major
        # order, adding the step to the next offset while no maximum has been seen yet
        idx = (torch.arange(Ho, device=x.device)[:, None] * (kh * W)
               + torch.arange(Wo, device=x.device)[None, :] * kw).expand(pooled.shape)
        return pooled, _first_max_idx(parts, pooled, idx, [i * W + j for i in range(kh) for j in range(kw)])

    # ----------------------------------------------------------------------------------- backward
    @torch.no_grad()
    def backward(self, V: torch.Tensor) -> None:
        """Back-propagate ``V`` ``[K, *out.shape]`` to every entry module's output (``call.grad``)."""
        K, N = V.shape[:2]
        g = V.transpose(0, 1).contiguous()  # [N, K, *out]: sample-major
        perm = None  # flat spatial positions of g's last dimension (after a space-to-depth conv backward)
        g_s2d = None  # instead of g: a conv's output gradient in 2x2-block order, [N, K, C, 4, P]
        for i in range(len(self.leaves) - 1, self.first - 1, -1):
            c = self._calls.get(i)
            if c is not None and g is not None:
                c.grad = g.transpose(0, 1)
            if i == self.first:
                break
            k = self.kinds[i]
            if k == "pool" and self._state[i] is not _FUSED:
                x_shape, idx, mask = self._state[i]
                C = x_shape[1]
                idx, mask = idx.reshape(N, C, -1), mask.reshape(N, C, -1) if mask is not None else None
                if perm is not None:  # g holds the pool's outputs in 2x2-block order (_s2d_perm)
                    idx, mask = _to_blocks(idx, *perm), _to_blocks(mask, *perm) if mask is not None else None
                v = g.reshape(N, K, C, -1)
                if mask is not None:  # fused ReLU (before the pool in the model) at the pool's output
                    v = v * mask[:, None]
                j = i - 1 if self._state[i - 1] is not _FUSED else i - 2
                if self.kinds[j] == "conv" and j == self.first and _simple_pool(self.leaves[i]):
                    # first entry conv -> [ReLU] -> max-pool: its gradient stays compressed (Call.pooled)
                    self._calls[j].pooled = (v, idx)
                    break
                if (self.kinds[j] == "conv" and perm is None and _pair(self.leaves[i].kernel_size) == (2, 2)
                        and _simple_pool(self.leaves[i]) and _s2d_ok(self.leaves[j], self._state[j])):
                    # the conv's output gradient directly in 2x2-block order (one broadcast multiply
                    # instead of zero-fill + scatter), the input of its space-to-depth backward
                    onehot = _slot_onehot(idx, x_shape[3], v.dtype)  # [N, C, 4, P]
                    g_s2d = v.new_empty(N, K, C, 4, idx.shape[2])
                    torch.mul(v[:, :, :, None, :], onehot[:, None], out=g_s2d)
                    g = None
                    if j in self._calls:
                        if self.block_order_ok:  # consumers only sum over positions (KFAC G)
                            self._calls[j].s2d = g_s2d.view(N, K, C, -1)
                        else:  # per-sample products: compressed (Call.pooled; dense on access)
                            self._calls[j].pooled = (v, idx)
                    continue
                perm = None
                g = self._pool_backward(self.leaves[i], x_shape, idx, v, K, N)
                continue
            if k == "conv" and g_s2d is not None:  # (its call got g or g_s2d above)
                nxt = self.kinds[i - 1] == "pool" and self._state[i - 1] is not _FUSED
                g, perm = _conv_backward_s2d(self.leaves[i], self._state[i], g_s2d, K, N, keep_order=nxt,
                                             w_s2d=self._s2d_weight_of(i))
                g_s2d = None
                continue
            g = self._backward_one(i, g, K, N)

    @staticmethod
    def _pool_backward(m: nn.MaxPool2d, x_shape, idx: torch.Tensor, v: torch.Tensor, K: int, N: int):
        """Scatter ``v`` ``[N, K, C, P]`` (pool outputs) to the pool's input through ``idx`` ``[N, C, P]``."""
        C, P = v.shape[2:]
        out = v.new_zeros(N, K, C, x_shape[2] * x_shape[3])
        index = idx[:, None].expand(N, K, C, P)
        kh, kw = _pair(m.kernel_size)
        stride = _pair(m.stride if m.stride is not None else m.kernel_size)
        dil = _pair(m.dilation)
        if stride[0] >= dil[0] * (kh - 1) + 1 and stride[1] >= dil[1] * (kw - 1) + 1:
            out.scatter_(3, index, v)  # windows do not overlap: each input feeds one output
        else:
            out.scatter_add_(3, index, v)
        return out.view(N, K, *x_shape[1:])

    def _backward_one(self, i: int, g: torch.Tensor, K: int, N: int) -> torch.Tensor:
        m, k, st = self.leaves[i], self.kinds[i], self._state[i]
        if st is _FUSED:
            return g
        if k == "linear":
            return g @ m.weight
        if k == "conv":
            x_shape = st
            C_out, Ho, Wo = g.shape[2:]
            kh, kw = m.kernel_size
            (sh, sw), (ph, pw), (dh, dw) = _pair(m.stride), _pair(m.padding), _pair(m.dilation)
            H, W = x_shape[-2:]
            op = (H - ((Ho - 1) * sh - 2 * ph + dh * (kh - 1) + 1), W - ((Wo - 1) * sw - 2 * pw + dw * (kw - 1) + 1))
            gi = F.conv_transpose2d(g.reshape(N * K, C_out, Ho, Wo), m.weight, None, (sh, sw), (ph, pw), op,
                                    1, (dh, dw))
            return gi.view(N, K, *gi.shape[1:])
        if k in ("relu", "tanh", "sigmoid", "act"):
            return g * st[:, None]
        if k == "view":
            return g.reshape(N, K, *st[1:])
        return g  # identity


def _first_max_idx(parts, pooled, idx, offs):
    """``idx`` (window origins) + offset of the first of ``parts`` equal to ``pooled``: walk the
    window in row-major order, adding the step to the next offset while no maximum was seen."""
    searching = None
    for q in range(len(parts) - 1):
        ne = parts[q] != pooled
        searching = ne if searching is None else searching & ne
        idx = torch.add(idx, searching, alpha=offs[q + 1] - offs[q])
    return idx


# ------------------------------------------------------------------ space-to-depth convolutions
def _conv_pool_s2d(m: nn.Conv2d, x: torch.Tensor, w_s2d: torch.Tensor | None = None):
    """Stride-1 Conv2d followed by a 2x2 / 2 max-pool, on 2x2 space-to-depth blocks: the conv
    computes ``[N, C_out, 4, Ho/2, Wo/2]`` (block channels ``(c, ry, rx)``: ``4 C_out`` output
    channels instead of ``C_out``, which oneDNN pads to 16) and the pool is the maximum over the 4
    contiguous ``(ry, rx)`` slabs. Measured on LeNet's conv1 + pool1 (1 or 2 threads): ~0.7 vs
    ~1.9 ms. ``w_s2d``: ``_s2d_weight(m.weight)`` when the caller holds it. Returns ``(z, pooled,
    idx)``: ``z()`` the conv output ``[N, C_out, Ho, Wo]`` (computed on call), ``pooled``
    ``[N, C_out, Ho/2, Wo/2]`` and ``idx`` as ``max_pool2d``'s indices."""
    N, C, H, W = x.shape
    kh, kw = m.kernel_size
    Ho, Wo = H - kh + 1, W - kw + 1
    xs = x.reshape(N, C, H // 2, 2, W // 2, 2).permute(0, 1, 3, 5, 2, 4).reshape(N, 4 * C, H // 2, W // 2)
    # the same blocked weight as the transposed conv's, read as Wf[(o, ry, rx), (c, qy, qx), ty, tx]
    # = w[o, c, 2 ty + qy - ry, 2 tx + qx - rx]; the bias repeated over (ry, rx)
    w = _s2d_weight(m.weight) if w_s2d is None else w_s2d
    b = None if m.bias is None else m.bias.detach().repeat_interleave(4)
    zs = F.conv2d(xs, w, b)[:, :, :Ho // 2, :Wo // 2].reshape(N, m.out_channels, 4, Ho // 2, Wo // 2)
    parts = zs.unbind(2)
    pooled = torch.maximum(torch.maximum(parts[0], parts[1]), torch.maximum(parts[2], parts[3]))
    idx = (torch.arange(Ho // 2, device=x.device)[:, None] * (2 * Wo)
           + torch.arange(Wo // 2, device=x.device)[None, :] * 2).expand(pooled.shape)
    idx = _first_max_idx(parts, pooled, idx, [0, 1, Wo, Wo + 1])

    def z():
        return zs.permute(0, 1, 3, 2, 4).reshape(N, m.out_channels, Ho // 2, 2, 2, Wo // 2) \
            .permute(0, 1, 2, 3, 5, 4).reshape(N, m.out_channels, Ho, Wo)

    return z, pooled, idx


def _s2d_ok(m: nn.Conv2d, x_shape) -> bool:
    """Stride-1 unpadded Conv2d with few input channels, odd kernel, even input and output maps."""
    kh, kw = m.kernel_size
    H, W = x_shape[-2:]
    return (_pair(m.stride) == (1, 1) and _pair(m.padding) == (0, 0) and _pair(m.dilation) == (1, 1)
            and m.in_channels < 16 and kh % 2 == 1 and kw % 2 == 1 and H % 2 == 0 and W % 2 == 0
            and H >= kh and W >= kw)


def _s2d_weight(w: torch.Tensor) -> torch.Tensor:
    """Conv weight in space-to-depth form (2x2 blocks): ``[C_out 4, C_in 4, T_h, T_w]``,
    ``T = k // 2 + 1``, with ``Ws[(o, qy, qx), (i, ry, rx), ty, tx] = w[o, i, 2 ty + ry - qy,
    2 tx + rx - qx]`` (zero outside the kernel). The transposed conv of ``_conv_backward_s2d`` uses
    it as written; the forward conv of ``_conv_pool_s2d`` reads the same tensor with the roles of
    ``q`` and ``r`` swapped."""
    Co, Ci, kh, kw = w.shape
    Th, Tw = kh // 2 + 1, kw // 2 + 1
    wp = F.pad(w.detach(), (1, 1, 1, 1))  # tap -1 and tap k (index shift +1) read zeros
    q = torch.arange(2, device=w.device)
    iy = (2 * torch.arange(Th, device=w.device)[None, None, :] + q[None, :, None] - q[:, None, None] + 1)
    ix = (2 * torch.arange(Tw, device=w.device)[None, None, :] + q[None, :, None] - q[:, None, None] + 1)
    wg = wp[:, :, iy.clamp(0, kh + 1)[:, :, :, None, None, None], ix.clamp(0, kw + 1)[None, None, None]]
    return wg.permute(0, 2, 5, 1, 3, 6, 4, 7).reshape(Co * 4, Ci * 4, Th, Tw)  # [o, qy, qx, i, ry, rx, ty, tx]


def _s2d_perm(H: int, W: int, device) -> torch.Tensor:
    """Flat positions ``(2 A + ry) W + 2 B + rx`` in space-to-depth order ``(ry, rx, A, B)``."""
    r = torch.arange(2, device=device)
    A = torch.arange(H // 2, device=device)
    B = torch.arange(W // 2, device=device)
    return ((2 * A[None, None, :, None] + r[:, None, None, None]) * W
            + 2 * B[None, None, None, :] + r[None, :, None, None]).reshape(-1)


def _to_blocks(t: torch.Tensor, H: int, W: int) -> torch.Tensor:
    """``[N, C, H W]`` (row-major positions) -> positions in 2x2-block order (``_s2d_perm``)."""
    N, C = t.shape[:2]
    return t.view(N, C, H // 2, 2, W // 2, 2).permute(0, 1, 3, 5, 2, 4).reshape(N, C, H * W)


def _slot_onehot(idx: torch.Tensor, W: int, dtype) -> torch.Tensor:
    """``[N, C, 4, P]``: which element of its 2x2 window (row-major) each max of a 2x2 / 2 pool
    came from; ``idx`` ``[N, C, P]`` flat positions in the ``W``-wide input, ``P`` windows."""
    N, C, P = idx.shape
    Wo = W // 2
    p = torch.arange(P, device=idx.device)
    off = idx - ((p // Wo) * (2 * W) + (p % Wo) * 2)  # 0, 1, W or W + 1
    return torch.stack([off == o for o in (0, 1, W, W + 1)], 2).to(dtype)


def _conv_backward_s2d(m: nn.Conv2d, x_shape, g_s2d: torch.Tensor, K: int, N: int, keep_order: bool,
                       w_s2d: torch.Tensor | None = None):
    """``conv_transpose2d`` through a stride-1 Conv2d of its output gradient given in 2x2-block
    order (``g_s2d`` ``[N, K, C_out, 4, Ho Wo / 4]``, ``(qy, qx, a, b)``), computed on the blocks:
    ``C_in 4`` output channels instead of ``C_in``. oneDNN pads output channels to 16, so with
    LeNet's conv2 (``C_in = 6``) the plain transposed conv wastes ~60% of its work; the blocked one
    (1.44x the multiply-adds, 24 of 32 channels used) measured ~1.35x faster (1 thread). ``w_s2d``:
    ``_s2d_weight(m.weight)`` when the caller holds it. Returns
    ``(grad, perm)``: with ``keep_order`` the grad stays in block order ``[N, K, C_in, H W]``
    (flat positions ``_s2d_perm(H, W)``) and ``perm = (H, W)`` (for a following max-pool's
    backward, which only needs its indices in the same order), else ``[N, K, C_in, H, W]`` and
    ``None``."""
    C_in, H, W = x_shape[1:]
    kh, kw = m.kernel_size
    Ho, Wo = H - kh + 1, W - kw + 1
    C_out = g_s2d.shape[2]
    w = _s2d_weight(m.weight) if w_s2d is None else w_s2d
    o = F.conv_transpose2d(g_s2d.reshape(N * K, C_out * 4, Ho // 2, Wo // 2), w)
    if keep_order:
        return o.view(N, K, C_in, H * W), (H, W)
    o = o.view(N, K, C_in, 2, 2, H // 2, W // 2).permute(0, 1, 2, 5, 3, 6, 4)
    return o.reshape(N, K, C_in, H, W), None
