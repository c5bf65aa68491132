"""``python -m dllm_rl.convert import | export | roundtrip``: HF safetensors ↔ framework
checkpoints (dllm_rl.models.convert)."""

import sys

from dllm_rl.models import convert

if __name__ == "__main__":
  sys.exit(convert.main())
