"""Benchmark: many right-hand sides through one QDLDL factorisation, QDLDL's binding one column a
call (what the integration tiles did) against ``depsi.kernels.ldl_numba`` (all columns in one
compiled pass), in the same process, printed as ratios (no asserts).

The matrices are normal matrices of random point networks (graph Laplacians plus a small
diagonal, 4 arcs a point), the sparsity of the w-test's tiles; thread CPU time, the smallest of
``--repeat`` runs.

Run: ``python benchmarks/bench_ldl_columns.py [--sizes 1000 3000 10000] [--columns 64]``
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import qdldl
import scipy.sparse as sp

from depsi.kernels.ldl_numba import LDLFactors


def network_normal_matrix(rng, n, arcs_per_point=4, reach=40):
    source = rng.integers(0, n, arcs_per_point * n)
    target = (source + rng.integers(1, reach, source.size)) % n
    adjacency = sp.coo_matrix((rng.uniform(0.5, 2.0, source.size), (source, target)),
                              shape=(n, n))
    adjacency = adjacency + adjacency.T
    degree = sp.diags(np.asarray(adjacency.sum(axis=1)).ravel())
    return (degree - adjacency + 1e-3 * sp.eye(n)).tocsc()


def smallest(func, repeat):
    times = []
    for _ in range(repeat):
        start = time.thread_time()
        func()
        times.append(time.thread_time() - start)
    return min(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 3000, 10000])
    parser.add_argument("--columns", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"LDL^T solves of {args.columns} columns, load average {os.getloadavg()[0]:.2f}")
    rng = np.random.default_rng(0)
    for n in args.sizes:
        compare(rng, n, args.columns, args.repeat)


def compare(rng, n, k, repeat):
    matrix = network_normal_matrix(rng, n)
    solver = qdldl.Solver(sp.triu(matrix, format="csc"))
    b = rng.standard_normal((n, k))
    columns = [np.ascontiguousarray(b[:, j]) for j in range(k)]
    factors = LDLFactors(solver)
    factors.solve(b)  # compiled, warm
    per_column = smallest(lambda: [solver.solve(c) for c in columns], repeat)
    together = smallest(lambda: factors.solve(b), repeat)
    extract = smallest(lambda: LDLFactors(solver), repeat)
    print(f"n {n:>6}, nnz(L) {factors._Lx.size:>8,}: QDLDL per column {per_column * 1e3:7.2f} ms, "
          f"ldl_numba {together * 1e3:7.2f} ms (+ {extract * 1e3:5.2f} ms to take the factors "
          f"once), ratio {per_column / together:4.2f}x")

if __name__ == "__main__":
    main()
