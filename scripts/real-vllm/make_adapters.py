"""Makes LoRA adapters for the tiny local model (make_model.py) with `peft`, no download:
random rank-8 weights on q_proj/v_proj (../shared/reference/real-vllm.md, "LoRA adapters").

Usage: python make_adapters.py MODEL_DIR OUT_DIR NAME [NAME ...]
Writes OUT_DIR/NAME (adapter_config.json + adapter_model.safetensors) for each NAME, each with
its own seed, so two adapters' outputs differ. `peft` and `accelerate` need only be importable
(fleet.sh installs them with `pip --target` beside the vLLM venv, leaving that venv as it is).
"""
import os
import sys
import zlib

import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaForCausalLM


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    model_dir, out, names = sys.argv[1], sys.argv[2], sys.argv[3:]
    os.makedirs(out, exist_ok=True)
    for name in names:
        torch.manual_seed(zlib.crc32(name.encode()))
        base = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.bfloat16)
        config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                            lora_dropout=0.0, init_lora_weights=False, task_type="CAUSAL_LM")
        peft_model = get_peft_model(base, config)
        peft_model.save_pretrained(os.path.join(out, name))
        print("adapter", name, "->", os.path.join(out, name))


if __name__ == "__main__":
    main()
