"""Engines: live models shared by the visitors of one server, and the jobs they run.

``pool`` (an ``Engine`` is one ``merge.live.LiveModel`` over a trio of checkpoints; the bounded
``EnginePool`` lends them out one job at a time, evicting idle ones least recently used),
``jobs`` (a job is plain data: kind, trio, what to show, items, generation settings; it returns
plain data) and ``dispatch`` (the one dispatcher: in this process on a CPU or a dedicated GPU,
through ``spaces.GPU`` on ZeroGPU; one heavy job per visitor, a bounded queue, estimates, time
budgets, cancellation). Above merge and evaluation, below the workbench."""
