"""Instruments, not mechanisms: timing and memory, the training race, the GPU check.

* :mod:`attnbook.lab.profiling` -- :func:`~attnbook.lab.profiling.compare` (alternating timings, medians) and
  :func:`~attnbook.lab.profiling.peak_memory`;
* :mod:`attnbook.lab.bench` -- time and memory of every mechanism of :mod:`attnbook.mechanisms` against N;
* :mod:`attnbook.lab.headtohead` -- a tiny model per mechanism trained on associative recall;
* :mod:`attnbook.lab.check_gpu` -- ``python -m attnbook.lab.check_gpu``, the GPU verification report.

Nothing in the mechanisms imports from here.
"""
