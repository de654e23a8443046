"""Benchmark: a w-test tile's factorisation and solves on the CPU, the host's sparse
factorisation (QDLDL, ``network_solver._factorise``) against the device formulation's dense
Cholesky run on NumPy (``network_solver._DeviceDense`` on ``Device("cpu")``), in the same
process, printed as ratios (no asserts). It says whether the dense formulation would also pay on
the CPU; the CPU keeps the sparse one.

The matrices are normal matrices of grid networks with both diagonals and random weights (the
reference removed); each case factorises once, solves 62 right-hand sides (the epochs) and four
blocks of 16 leverage probes, one BLAS thread (as the tiles run); the smallest of ``--repeat``
runs.

Run: ``python benchmarks/bench_tile_factorisation.py [--sides 18 32 55 95]``
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from threadpoolctl import threadpool_limits

from depsi.kernels.backend import Device
from depsi.processing import network_solver


def grid_normal(side: int, rng) -> object:
    grid = np.arange(side * side).reshape(side, side)
    pairs = np.vstack([np.c_[grid[:, :-1].ravel(), grid[:, 1:].ravel()],
                       np.c_[grid[:-1].ravel(), grid[1:].ravel()],
                       np.c_[grid[:-1, :-1].ravel(), grid[1:, 1:].ravel()],
                       np.c_[grid[:-1, 1:].ravel(), grid[1:, :-1].ravel()]])
    weights = rng.uniform(0.5, 4.0, len(pairs))
    A = network_solver.incidence_matrix(pairs[:, 0], pairs[:, 1], side * side)[:, 1:]
    return (A.T @ A.multiply(weights[:, None])).tocsc()


def factorise_and_solve(factorise, normal, rhs) -> float:
    start = time.perf_counter()
    factor = factorise(normal)
    factor.solve(rhs)
    for _ in range(4):
        factor.solve(rhs[:, :16])
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sides", type=int, nargs="+", default=[18, 32, 55, 95])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"a tile's factorisation and solves, load average {os.getloadavg()[0]:.2f}")
    rng = np.random.default_rng(0)
    dense = lambda normal: network_solver._DeviceDense(normal, Device("cpu"))  # noqa: E731
    with threadpool_limits(limits=1, user_api="blas"):
        for side in args.sides:
            normal = grid_normal(side, rng)
            rhs = rng.standard_normal((normal.shape[0], 62))
            sparse_s = min(factorise_and_solve(network_solver._factorise, normal, rhs)
                           for _ in range(args.repeat))
            dense_s = min(factorise_and_solve(dense, normal, rhs)
                          for _ in range(args.repeat if normal.shape[0] < 5000 else 1))
            print(f"unknowns {normal.shape[0]:>6}: sparse (QDLDL) {sparse_s * 1e3:8.1f} ms, "
                  f"dense Cholesky {dense_s * 1e3:8.1f} ms, dense / sparse "
                  f"{dense_s / sparse_s:6.1f}x")


if __name__ == "__main__":
    main()
