#!/usr/bin/python3
"""Fits the polynomial coefficients of kernels/cpu/vector_math.h's erf (float) and reports its
error in float ulps over [-6, 6] against float64 erf; needs Debian's python3-torch (float64 least
squares). Usage: /usr/bin/python3 kernels/cpu/fit_erf.py

  |x| < 1:  erf(x) = x * P(x^2)                       (P of degree 6, relative least squares)
  |x| >= 1: erf(x) = 1 - exp(-x^2) * Q(v), v = (1/|x| - 0.625) / 0.375   (Q of degree 10 over
            |x| in [1, 4], erfcx = exp(x^2) erfc(x); |x| is clamped to 4, where erf is 1 in float)
"""
import torch

torch.set_default_dtype(torch.float64)


def fit(xs, ys, degree):
    w = 1.0 / ys  # relative error
    a = torch.stack([xs**k for k in range(degree + 1)], 1) * w[:, None]
    return torch.linalg.lstsq(a, ys * w).solution


def horner(c, s):
    r = torch.zeros_like(s) + c[-1]
    for k in range(len(c) - 2, -1, -1):
        r = r * s + c[k]
    return r


x = torch.linspace(1e-4, 1.0, 20001)
small = fit(x * x, torch.special.erf(x) / x, 6)
x = torch.linspace(1.0, 4.0, 20001)
large = fit((1 / x - 0.625) / 0.375, torch.special.erfcx(x), 10)
print("P:", ", ".join("%.9ef" % c for c in small))
print("Q:", ", ".join("%.9ef" % c for c in large))

f = torch.float32


def erf32(x):
    x = x.to(f)
    a = x.abs()
    p = a * horner(small.to(f), a * a)
    ac = a.clamp(1.0, 4.0)
    v = (1 / ac - torch.tensor(0.625, dtype=f)) / torch.tensor(0.375, dtype=f)
    x2 = ac * ac
    lo = (ac.double() * ac.double() - x2.double()).to(f)  # the fma's exact remainder
    q = 1 - torch.exp(-x2) * (1 - lo) * horner(large.to(f), v)
    return torch.copysign(torch.where(a < 1.0, p, q), x)


xs = torch.linspace(-6, 6, 2000001)
ref = torch.special.erf(xs.to(f).double())
ulp = torch.nextafter(ref.to(f).abs(), torch.tensor(10.0, dtype=f)).double() - ref.to(f).abs().double()
err = (erf32(xs).double() - ref).abs() / ulp
print("max error %.2f ulp at x = %.6f" % (err.max().item(), xs[err.argmax()].item()))
