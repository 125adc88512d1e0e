"""The speed annex: code that exists only to make the plain forms of the mechanism modules faster.

Each mechanism module is its chapter's mathematics in plain torch; :mod:`attnbook.linear` reaches a path here by
one dispatch line, as timm's attention reaches SDPA through ``fused_attn``.
:func:`attnbook.config.plain` (``ATTNBOOK_PLAIN=1``, or :func:`attnbook.config.set_plain`) turns the annex off;
then no module of this package is imported. Every path here gives the plain form's numbers to rounding (the
tests compare them, and both with :mod:`attnbook.reference`), and stays only while ``benchmarks/bench_annex.py``
measures it at least 1.3 times faster than the plain form in every condition where it runs: quiet, after another
large workload, beside two busy processes, on one and on two threads. The recorded table is in
``benchmarks/results/PERFORMANCE.md``.

* :mod:`attnbook._fast.causal` -- causal linear attention without autograd on one CPU thread, tile by tile.

Two paths for Mobile-Attention's inference were here and failed that rule: its flows from each position's H x H
Gram matrix, 0.66 times the plain form on two threads beside busy processes
(``benchmarks/results/annex_f840f0a.json``), and its core with one workspace for every product of the inputs' size
and no ``x + eps`` tensors, 1.43 to 2.28 times the plain form quiet but 1.20 times after other work
(``benchmarks/results/annex_8dd3fec.json``).
"""
