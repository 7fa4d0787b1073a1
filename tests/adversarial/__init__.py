"""The adversarial suite: bad inputs, settings and host layouts, each refused
with its exit code and one clear line, touching nothing it should not."""
