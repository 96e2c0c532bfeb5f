"""Issue 48's programs on a real GPU (tests/gpu/frameworks.sh runs them under gpudoc):
    python3 frameworks.py jax_leak [STEPS]     a jitted step whose 16 MiB output is kept in a list
    python3 frameworks.py jax_healthy [STEPS]  the same step, its output dropped
    python3 frameworks.py jax_oom              2 GiB outputs kept until XLA's allocator runs out: under the
                                               default preallocation (75% of the GPU), with the rest free
    python3 frameworks.py cupy_bloat [SECONDS] a one-off 8 GiB temporary, dropped, then a 512 MiB working set:
                                               CuPy's pool keeps the 8 GiB
    python3 frameworks.py tf_leak [BATCHES]    Keras's fit, each batch's 16 MiB output kept in a list, under
                                               TensorFlow's default (no memory growth)
    python3 frameworks.py tf_healthy [BATCHES] the same with TF_FORCE_GPU_ALLOW_GROWTH=true set by the script
                                               (before TensorFlow starts), the output dropped
Each prints its own view of the allocator at its end (one JSON line), to check the report's against."""
import json
import sys
import time

what = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 300
MiB = 1 << 20


def jax_program():
    import jax
    import jax.numpy as jnp

    params = jnp.ones((128 * MiB,), dtype=jnp.float32)  # 512 MiB
    size = (512 if what == "jax_oom" else 4) * MiB  # float32 elements: 2 GiB or 16 MiB

    @jax.jit
    def step(p, i):
        return jnp.full((size,), i, dtype=jnp.float32) + p[0]

    kept = []
    steps = 100000 if what == "jax_oom" else n
    for i in range(steps):
        out = step(params, i)
        out.block_until_ready()
        if what != "jax_healthy":
            kept.append(out)
        time.sleep(0.005)
    stats = jax.local_devices()[0].memory_stats()
    print(json.dumps({"steps": steps, "kept": len(kept), "stats": stats}))


def cupy_program():
    import cupy

    pool = cupy.get_default_memory_pool()
    temporary = cupy.empty(8 << 30, dtype=cupy.uint8)
    temporary.fill(1)
    del temporary
    end = time.time() + float(sys.argv[2] if len(sys.argv) > 2 else 3)
    work = None
    while time.time() < end:
        work = None
        work = [cupy.ones(64 * MiB, dtype=cupy.float32) for _ in range(2)]  # 2 x 256 MiB
        cupy.cuda.Device().synchronize()
        time.sleep(0.01)
    del work
    print(json.dumps({"used": pool.used_bytes(), "total": pool.total_bytes(),
                      "free_blocks": pool.n_free_blocks()}))


def tf_program():
    import os

    if what == "tf_healthy":
        os.environ["TF_FORCE_GPU_ALLOW_GROWTH"] = "true"
    import tensorflow as tf

    kept = []

    class Model(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(tf.ones((128 * MiB,)))  # 512 MiB

        def train_step(self, data):
            out = tf.fill((4 * MiB,), 1.0) + self.w[0]  # 16 MiB
            if what == "tf_leak":
                kept.append(out)
            return {"loss": tf.reduce_sum(out[:1])}

    model = Model()
    model.compile()
    data = tf.data.Dataset.from_tensors(tf.zeros((1,))).repeat(n)
    model.fit(data, epochs=1, verbose=0)
    info = tf.config.experimental.get_memory_info("GPU:0")
    print(json.dumps({"steps": n, "kept": len(kept), "info": info, "version": tf.__version__}))


if what.startswith("jax"):
    jax_program()
elif what.startswith("tf"):
    tf_program()
else:
    cupy_program()
