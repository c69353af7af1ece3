"""Conv2d KFAC ``A`` factor by row-pair products: faster than ``modules.conv_A`` on small images.

Hand-written (no library computes the patch Gram without im2col). ``A = sum_{n,s} x_{ns} x_{ns}^T``
over the ``[C_in kh kw]`` patches ``x_{ns}`` of a Conv2d. Entry ``((c, i, j), (c', i', j'))`` is
``sum_{n,p,q} a[n, c, p sh + i dh, q sw + j dw] a[n, c', p sh + i' dh, q sw + j' dw]``: a sum of
products of input rows ``y = p sh + i dh`` and ``y' = y + (i' - i) dh``. ``conv_A_rows``:

1. one batched GEMM: every input row ``y`` (``[C W, N]``, all channels and columns) times its
   ``kh`` partner rows ``y, y + dh, ..., y + (kh - 1) dh`` (one ``[N, kh C W]`` view, no copy):
   ``D[y] = [C W, kh C W]`` -- ``H kh (C W)^2 N`` multiply-adds in GEMMs of a good shape;
2. a strided sum over the output columns ``q`` (the column pairs ``(q sw + j dw, q sw + j' dw)``
   lie on diagonals of each ``[W, W]`` block) and one over the output rows ``p``;
3. the ``kh x kh`` blocks assembled by symmetry.

``modules.conv_A`` (width unfold, one GEMM per row offset) costs ``~kh H (C kw)^2 N Wo``
multiply-adds in ``[C kw, N Wo] x [N Wo, C kw]`` GEMMs (tiny outputs, long inner dimension). The
row-pair form costs ``W^2 / (kw^2 Wo)`` times that; on LeNet-5 (1 thread, batch 128) it measured
0.75 vs 1.0-1.5 ms (conv1, ``W^2 / (kw^2 Wo) = 1.3``) and 1.8 vs 2.9-3.5 ms (conv2, 0.72).
``rows_cheaper`` picks it when that ratio is at most 1.5 and ``D`` stays small (wide images
and 3x3 kernels, e.g. ResNets on 32x32, keep ``conv_A``). Exact: plain sums of products.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

MAX_D_ELEMENTS = 2**22  # [H, C W, kh C W] product of one batch (16 MiB in float32)


def conv_geometry(m: nn.Conv2d, a: torch.Tensor):
    """``(kh, kw, sh, sw, dh, dw, ph, pw, H, W, Ho, Wo)`` of Conv2d ``m`` on input ``a``
    ``[N, C, H_in, W_in]``; ``H, W`` are the zero-padded input's sizes."""
    kh, kw = m.kernel_size
    (sh, sw), (dh, dw), (ph, pw) = m.stride, m.dilation, m.padding
    H, W = a.shape[2] + 2 * ph, a.shape[3] + 2 * pw
    Ho = (H - dh * (kh - 1) - 1) // sh + 1
    Wo = (W - dw * (kw - 1) - 1) // sw + 1
    return kh, kw, sh, sw, dh, dw, ph, pw, H, W, Ho, Wo


def rows_cheaper(m: nn.Conv2d, a: torch.Tensor) -> bool:
    """Whether ``conv_A_rows`` is the faster exact kernel for this layer and input."""
    kh, kw, *_, H, W, Ho, Wo = conv_geometry(m, a)
    C = a.shape[1]
    if Ho < 1 or Wo < 1:
        return False
    return W * W <= 1.5 * kw * kw * Wo and H * kh * (C * W) ** 2 <= MAX_D_ELEMENTS


def conv_A_rows(m: nn.Conv2d, a: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``(sum_{n,s} x_{ns} x_{ns}^T [C kh kw, C kh kw], N S)``, as ``modules.conv_A``."""
    kh, kw, sh, sw, dh, dw, ph, pw, H, W, Ho, Wo = conv_geometry(m, a)
    if ph or pw:
        a = F.pad(a, (pw, pw, ph, ph))
    N, C = a.shape[:2]
    CW, ext = C * W, dh * (kh - 1)
    T = a.new_zeros(H + ext, CW, N)  # [row y, (c, x), n]; zero rows below as partners of the last rows
    T[:H] = a.permute(2, 1, 3, 0).reshape(H, CW, N)
    # partners of row y: rows y + e dh (e < kh) as one [kh C W, N] matrix, a strided view of T
    R = T.as_strided((H, kh, CW, N), (CW * N, dh * CW * N, N, 1)).reshape(H, kh * CW, N)
    D = torch.bmm(T[:H], R.transpose(1, 2))  # [y, (c, x), (e, c', x')]
    s0, s1, s2 = D.stride()
    # sum over output columns q: x = q sw + j dw, x' = q sw + j' dw (diagonals of [W, W] blocks)
    E = D.as_strided((H, C, kw, kh, C, kw, Wo),
                     (s0, W * s1, dw * s1, CW * s2, W * s2, dw * s2, sw * (s1 + s2))).sum(-1)
    # sum over output rows p: y = p sh + i dh -> B[i, c, j, e, c', j'] = block (i, i + e) of A
    t = E.stride()
    B = E.as_strided((kh, Ho, *E.shape[1:]), (dh * t[0], sh * t[0], *t[1:])).sum(1)
    A = a.new_empty(kh, kh, C, kw, C, kw)  # [i, i', c, j, c', j']
    for e in range(kh):
        blk = B[:kh - e, :, :, e]  # [kh - e, C, kw, C, kw]
        A.diagonal(e, 0, 1).copy_(blk.permute(1, 2, 3, 4, 0))
        if e:
            A.diagonal(-e, 0, 1).copy_(blk.permute(3, 4, 1, 2, 0))
    return A.permute(2, 0, 3, 4, 1, 5).reshape(C * kh * kw, C * kh * kw), N * Ho * Wo
