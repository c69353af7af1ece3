"""Dense float64 references for the Laplace tests (torch.func Jacobians/Hessians), written
independently of the engine's likelihood code."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, hessian, jacrev, vmap


def mlp(d_in=3, d_hidden=5, d_out=3, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d_in, d_hidden), nn.Tanh(), nn.Linear(d_hidden, 4), nn.Tanh(),
                         nn.Linear(4, d_out)).double()


def cnn(d_out=3, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(1, 2, 3, padding=1, stride=2), nn.Tanh(), nn.Conv2d(2, 2, 2),
                         nn.Tanh(), nn.Flatten(), nn.Linear(8, d_out)).double()


def data(model_kind, likelihood, n=12, d_out=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 3, generator=g, dtype=torch.float64) if model_kind == "mlp" else \
        torch.randn(n, 1, 6, 6, generator=g, dtype=torch.float64)
    if likelihood == "classification":
        y = torch.randint(0, d_out, (n,), generator=g)
    elif likelihood == "regression":
        y = torch.randn(n, d_out, generator=g, dtype=torch.float64)
    else:
        y = torch.randn(n, d_out // 2, generator=g, dtype=torch.float64)
    return X, y


def loader(X, y, batch_size=None):
    ds = torch.utils.data.TensorDataset(X, y)
    return torch.utils.data.DataLoader(ds, batch_size=batch_size or len(X))


def sample_nll(likelihood: str, f: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """NLL of ONE sample (f: [C]); regression with unit noise and the 0.5 convention."""
    if likelihood == "classification":
        return -f.log_softmax(-1).gather(-1, y.reshape(1)).sum()
    if likelihood == "regression":
        return 0.5 * (f - y).square().sum()
    D = f.shape[0] // 2
    eta1, eta2 = f[:D], -F.softplus(f[D:])
    return hetero_nll_natural(eta1, eta2, y)


def hetero_nll_natural(eta1, eta2, y):
    mean, var = -eta1 / (2 * eta2), -1 / (2 * eta2)
    return -torch.distributions.Normal(mean, var.sqrt()).log_prob(y).sum()


def output_hessian(likelihood: str, f: torch.Tensor) -> torch.Tensor:
    """[N, C, C] output-space curvature of the per-sample NLL used by the GGN."""
    N, C = f.shape
    if likelihood == "classification":
        return vmap(hessian(lambda fn: -fn.log_softmax(-1)[0]))(f)  # independent of the label
    if likelihood == "regression":
        return torch.eye(C, dtype=f.dtype).expand(N, C, C)
    D = C // 2
    y0 = torch.zeros(D, dtype=f.dtype)  # the Hessian of the NLL in eta does not depend on y
    out = []
    for fn in f:  # GGN w.r.t. natural params, link Jacobian folded in
        eta = torch.cat([fn[:D], -F.softplus(fn[D:])])
        H_eta = hessian(lambda e: hetero_nll_natural(e[:D], e[D:], y0))(eta)
        Jl = torch.diag(torch.cat([torch.ones(D, dtype=f.dtype), -torch.sigmoid(fn[D:])]))
        out.append(Jl.T @ H_eta @ Jl)
    return torch.stack(out)


def subset_names(model, la):
    names = {id(p): n for n, p in model.named_parameters()}
    return [names[id(p)] for p in la.params]


def model_fn(model, la):
    names = subset_names(model, la)
    sizes = [p.numel() for p in la.params]
    shapes = [p.shape for p in la.params]

    def f(theta, X):
        chunks = torch.split(theta, sizes)
        return functional_call(model, {n: c.view(s) for n, c, s in zip(names, chunks, shapes)}, (X,))

    return f


def dense_jacobian(model, la, X) -> torch.Tensor:
    f = model_fn(model, la)
    theta = torch.cat([p.detach().reshape(-1) for p in la.params])  # the weights (la.mean before fit is the prior mean)
    J = jacrev(lambda th: f(th, X))(theta)  # [N, C, P]
    return J.reshape(X.shape[0], -1, la.n_params)


def dense_curvature(model, la, X, y, curvature="ggn", likelihood="classification") -> torch.Tensor:
    with torch.no_grad():
        fX = model(X).reshape(X.shape[0], -1)
    J = dense_jacobian(model, la, X)
    if curvature == "ggn":
        H = output_hessian(likelihood, fX)
        return torch.einsum("ncp,ncd,ndq->pq", J, H, J)
    if curvature == "ef":
        g = vmap(torch.func.grad(lambda fn, yn: sample_nll(likelihood, fn, yn)))(fX, y)
        G = torch.einsum("ncp,nc->np", J, g)
        return G.T @ G
    raise ValueError(curvature)


def dense_loglik(model, X, y, likelihood, sigma=1.0):
    with torch.no_grad():
        fX = model(X).reshape(X.shape[0], -1)
    nll = sum(sample_nll(likelihood, fn, yn) for fn, yn in zip(fX, y))
    if likelihood == "regression":
        return -nll / sigma**2 - fX.numel() * math.log(sigma * math.sqrt(2 * math.pi))
    return -nll


def dense_marglik(loglik, H, c, prior_diag, mean):
    Pm = c * H + torch.diag(prior_diag)
    return loglik - 0.5 * (torch.linalg.slogdet(Pm)[1] - prior_diag.log().sum() + (mean * prior_diag) @ mean)
