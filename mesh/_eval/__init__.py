"""``mesh eval``: test the composed mesh (answers, trajectories across hops, bounds, faults).

cases (the file format) -> run (``Evaluator``: sends the turns, reads the trace) -> trace (the
tasks of one trace on every node) -> matchers (the checks) -> report (table, JSON, JUnit).
"""
