# The transformer-mixer hybrid of Badger 2024, "Masked Mixers for Language Generation
# and Retrieval" (arXiv 2409.01482): the paper's most efficient TinyStories learner,
# attention whose output also passes through a masked token mixing (mixer.py's
# 'hybrid'), at the transformer baseline's shape: d_model 512, 8 layers, 4 heads,
# n_ctx 512, lr 5e-3.
# Reported: eval loss 1.59 against the transformer's 1.61 in the paper's hybrid
# comparison (the best of its TinyStories models).
# Same data, tokens per step and steps as config/mixer_gpu.py and transformer_gpu.py.
# The whole 65 k-token step in one micro-batch of 128 windows, compiled. Measured on one H200
# (docs/performance.md, "On a GPU"): 13.2 GiB of GPU memory at its peak (max_memory_allocated, bf16),
# 100 steps. On a card without room for it, lower batch_size and raise grad_accum (the same tokens
# per step).
variant = 'hybrid'
d_model = 512
n_layer = 8
n_head = 4
n_ctx = 512
batch_size = 128
grad_accum = 1
compile = True
max_iters = 20000
learning_rate = 5e-3
min_lr = 3e-4
warmup_iters = 500
eval_interval = 1000
eval_windows = 256
out_dir = 'out/hybrid_gpu'
