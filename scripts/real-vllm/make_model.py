"""Builds a tiny random-weight Llama model with a locally trained tokenizer and a chat
template, for a real vLLM on CPU without any download (../shared/reference/real-vllm.md).

Usage: python make_model.py OUT_DIR [--layers N] [--hidden N] [--seed N]
A different --seed gives different weights (another model with the same tokenizer).
The tokenizer is a byte-level BPE (4096 tokens) trained on the Python standard library's own
sources, which every machine has. Output text is noise; routing does not care.
"""
import argparse
import glob
import os
import sysconfig

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL = ["<s>", "</s>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))[:200]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train(files, trainers.BpeTrainer(vocab_size=args.vocab, special_tokens=SPECIAL,
                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(args.out)

    torch.manual_seed(args.seed)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=args.hidden,
        intermediate_size=args.hidden * 4, num_hidden_layers=args.layers,
        num_attention_heads=max(1, args.hidden // 64), num_key_value_heads=max(1, args.hidden // 64),
        max_position_embeddings=4096, bos_token_id=tok.token_to_id("<s>"),
        eos_token_id=tok.token_to_id("</s>"), torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(args.out)
    print("model", args.out, "layers", args.layers, "hidden", args.hidden,
          "vocab", tok.get_vocab_size(), "seed", args.seed)


if __name__ == "__main__":
    main()
