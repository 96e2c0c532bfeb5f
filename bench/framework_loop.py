"""A loop of jitted JAX steps or CuPy operations at the fastest rates users run, timed from inside, for the
shim's cost on a JAX or CuPy job (tests/gpu/frameworks_cost.sh runs it bare and under gpudoc, alternated).
    python3 bench/framework_loop.py jax|cupy|tensorflow STEPS
jax: a jitted SGD step of a 2-layer MLP (batch 64, width 256) whose new parameters feed the next call, the
result waited for every 100 steps as a loop that logs its loss does (JAX's dispatch is asynchronous: a loop
that never waits measures only its Python); cupy: the same MLP's forward and an update in CuPy arrays,
synchronized every 100 steps; tensorflow: the same SGD step as one tf.function (a custom training
loop's step, which the shim counts at tf.function's class), its loss read every 100 steps. Prints one JSON
line: steps, seconds and steps a second after 200 warm-up
steps."""
import json
import sys
import time

kind, steps = sys.argv[1], int(sys.argv[2])
WARM, WAIT = 200, 100


def jax_loop():
    import jax
    import jax.numpy as jnp

    k = jax.random.PRNGKey(0)
    w1 = jax.random.normal(k, (256, 256)) * 0.05
    w2 = jax.random.normal(k, (256, 256)) * 0.05
    x = jax.random.normal(k, (64, 256))

    def loss(p, x):
        h = jnp.tanh(x @ p[0])
        return jnp.mean((h @ p[1]) ** 2)

    @jax.jit
    def step(p, x):
        g = jax.grad(loss)(p, x)
        return [a - 1e-3 * b for a, b in zip(p, g)]

    state = {"p": [w1, w2]}

    def one():
        state["p"] = step(state["p"], x)
        return state["p"]

    return one, jax.block_until_ready


def timed(one, wait):
    for i in range(WARM):
        out = one()
    wait(out)
    t0 = time.perf_counter()
    for i in range(steps):
        out = one()
        if i % WAIT == WAIT - 1:
            wait(out)
    wait(out)
    return time.perf_counter() - t0


def tf_loop():
    import tensorflow as tf

    w1 = tf.Variable(tf.random.normal((256, 256)) * 0.05)
    w2 = tf.Variable(tf.random.normal((256, 256)) * 0.05)
    x = tf.random.normal((64, 256))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.matmul(tf.tanh(tf.matmul(x, w1)), w2) ** 2)
        for w, g in zip((w1, w2), tape.gradient(loss, [w1, w2])):
            w.assign_sub(1e-3 * g)
        return loss

    return step, lambda out: out.numpy()


if kind == "jax":
    one, wait = jax_loop()
elif kind == "tensorflow":
    one, wait = tf_loop()
else:
    import cupy as cp

    w1 = cp.random.standard_normal((256, 256), dtype=cp.float32) * 0.05
    w2 = cp.random.standard_normal((256, 256), dtype=cp.float32) * 0.05
    x = cp.random.standard_normal((64, 256), dtype=cp.float32)

    def one():
        h = cp.tanh(x @ w1)
        y = h @ w2
        w2[...] -= 1e-6 * (h.T @ y)  # in place: the next step sees the update
        return y

    def wait(out):
        cp.cuda.Stream.null.synchronize()

s = timed(one, wait)
print(json.dumps({"kind": kind, "steps": steps, "s": round(s, 4), "steps_per_s": round(steps / s, 1)}))
