"""The model-driven kernel writer (issue #18): an OpenAI-compatible endpoint proposes a kernel for a
region, and a proposal is kept only if it passes every check and is faster than ours.

Modules (imported on use, so `import agent_core.writer` costs nothing when the feature is off):
- config.py:     WriterConfig (endpoint URL, model, rounds, caps; the key only ever from the environment)
- endpoint.py:   ChatEndpoint (chat completions over HTTP: streaming, timeouts, retries), Reply,
                 TokenBudget, WriterError / EndpointError
- proposal.py:   parse_reply: the model's answer -> a KernelSource in our launch interface
- gate.py:       Rejected, static_check and check_proposal: the anti-hack gate
- prompt.py:     first_messages and feedback_message: what the model is told each round
- executors.py:  CpuExecutor / GpuExecutor: run a proposal on guarded buffers in a child process
                 (emulate.py + emulate_shim.h on the CPU, gpu_exec.py on the GPU)
- loop.py:       write_region: the rounds for one region, and the decision to keep or not
"""
