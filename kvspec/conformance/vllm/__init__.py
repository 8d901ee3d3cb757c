"""The vLLM seam: the code that drives vLLM's own classes.

``targets`` adapts vLLM's ``BlockPool`` and ``KVCacheManager`` and converts
kvspec's configs and requests into vLLM's; ``scheduler`` builds vLLM's own
``Scheduler`` for the scheduler-scope machine and ``connector`` is the
scripted KV connector vLLM loads into it; ``scheduler_findings`` holds the
minimal traces of what that machine found in vLLM; ``version_probe`` replays
every finding against the installed release (``tools/version_matrix.py``);
``compat`` holds the reference release and every switch on the release;
``installed`` answers whether and which vLLM is here; ``offload`` builds
and reads vLLM's offloading tier (its ``CPUOffloadingManager``, spec
chapter 11); ``upstream`` is a
vLLM release beside it, run in a child process (the upstream a fork runs in
lockstep with: ``kvspec conform --against``).  The seam has two
more rooms, each at the layer that uses it (``tests/test_layers.py``):
``kvspec.models.vllm_*`` (the kernel stage's side: vLLM's spec classes,
its worker path, its Triton kernels) and :mod:`kvspec.dropin` (impl inside
vLLM).  Nothing else in kvspec's package imports vLLM
(``tests/test_vllm_seam.py``).
vLLM is imported lazily, inside these modules' functions, so that kvspec
installs and runs without it.

One folder, its modules at four heights of conformance's ladder
(``tests/test_layers.py``): ``compat``, ``installed``, ``scheduler``,
``connector`` and ``offload`` below targets/ (they import nothing of conformance);
``targets`` and ``upstream`` above targets/; ``scheduler_findings`` above
machines/; ``version_probe`` at the top, beside the gate's readers.
"""
