"""Executors for builds: a target task (exec.task), run by `local`, `pool` or `ray`
(exec.executors, exec.ray_executor), over recipes x targets with a report (exec.matrix).

Tasks share work through the content-addressed step cache: a step every target needs (an
export) is computed by one worker while the others wait for its entry, then read it.
"""
