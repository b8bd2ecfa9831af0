"""Inference: running a model on token ids, below evaluation. The prompt pass (``prefill``), the
refilled greedy decoding loop (``decoding``), batched generation (``generation``), streaming and
chat (``chat``), stop strings (``stops``), the chat-prompt renderer (``prompts``), the GSM8K
calculator (``calculator``), the CPU and CUDA kernels of decoding passes (``attention``,
``products``) and the lean Llama of ``layerswap eval`` (``lean``)."""
