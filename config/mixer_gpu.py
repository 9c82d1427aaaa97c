# The flat masked mixer of Badger 2024, "Masked Mixers for Language Generation and
# Retrieval" (arXiv 2409.01482), TinyStories causal LM: d_model 1024, 8 layers, one
# (flat, n_head 1) masked token mixing per block, n_ctx 512.
# Reported: eval loss 1.89 for the flat mixer against 1.71 for the llama-style
# transformer (config/transformer_gpu.py), each trained 12 h on one RTX 3060.
# Needs the full TinyStories (python data/prepare.py, no flags: downloads 1.9 GB) and
# one GPU: about 70 M parameters; bf16 (dtype 'auto' on CUDA); 128 windows of 512
# tokens = 65 k tokens per step, 20 k steps = about 1.3 B tokens (3 epochs).
# The learning rate setting is this repository's (config/tinystories_cpu.py), not the paper's.
# The whole 65 k-token step in one micro-batch of 128 windows, compiled. Measured on one H200
# (docs/performance.md, "On a GPU"): 17.1 GiB of GPU memory at its peak (max_memory_allocated, bf16),
# 100 steps. On a card without room for it, lower batch_size and raise grad_accum (the same tokens
# per step).
variant = 'flat'
d_model = 1024
n_layer = 8
n_ctx = 512
batch_size = 128
grad_accum = 1
compile = True
max_iters = 20000
learning_rate = 5e-3
mixing_lr_mult = 0.3
beta2 = 0.99
min_lr = 3e-4
warmup_iters = 500
eval_interval = 1000
eval_windows = 256
out_dir = 'out/mixer_gpu'
