"""Policies kept for study (pure Python, no torch): they run live and in the simulator,
but the default beats them on its worst validation point (docs/scheduling.md).

Owns: the Gittins-ranked level queue (`gittins_queue`: levels by the Gittins index of
the remaining service, an FCFS-turn guard, switch-cost lifts) and its ranking of
prompts and learned output lengths (`ranks`). `fsd.sched.registry` names it beside
the policies fsd keeps.

May import: fsd.sched (the level base, learned lengths, the queue interface), fsd.cost,
fsd.jobs, fsd.config_checks. Never torch, nor fsd.engine, fsd.server, fsd.sim or the
console, as fsd.sched.
"""
