"""``python -m dllm_rl.data`` = ``dllm-rl-data``."""

from dllm_rl.data.cli import run

if __name__ == "__main__":
  run()
