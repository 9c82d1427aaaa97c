# A flat masked mixer that trains on the shared TinyStories part on 2 CPU cores.
d_model = 256
n_layer = 4
n_ctx = 256
batch_size = 16
max_iters = 650
learning_rate = 3e-3
min_lr = 3e-4
warmup_iters = 50
eval_interval = 100
out_dir = 'out/tinystories_cpu'
