"""A JAX out-of-memory failure: ask for far more than the card has."""
import jax.numpy as jnp

x = jnp.ones((200 * (1 << 30),), dtype=jnp.uint8)
x.block_until_ready()
