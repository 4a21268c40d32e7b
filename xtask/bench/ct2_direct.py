"""The reference of `cargo xtask bench bridge`: the same CTranslate2 Generator, model, settings
and prompt as Hangar's ct2 worker, called directly in Python.

usage: ct2_direct.py MODEL_DIR ROUNDS N...

Loads the model once (compute type float32, one intra-op thread, CPU, as the bench's Hangar
config), then for each of ROUNDS rounds and each N generates greedily from the raw prompt
`A hangar is` with `max_length=N` and the model's end tokens, collecting the token ids and
decoding the text once at the end (what a direct user minimally does). Prints one JSON line:
{"N": [seconds per round, ...], ..., "tokens": {"N": generated tokens}}.
"""

import json
import sys
import time

import ctranslate2
import tokenizers

PROMPT = "A hangar is"
END_TOKENS = ["<|im_end|>", "<|endoftext|>"]


def main():
    path, rounds, sizes = sys.argv[1], int(sys.argv[2]), [int(n) for n in sys.argv[3:]]
    generator = ctranslate2.Generator(
        path, device="cpu", compute_type="float32", inter_threads=1, intra_threads=1
    )
    tokenizer = tokenizers.Tokenizer.from_file(f"{path}/tokenizer.json")
    out = {str(n): [] for n in sizes}
    tokens = {}
    for _ in range(rounds):
        for n in sizes:
            started = time.perf_counter()
            prompt = tokenizer.encode(PROMPT, add_special_tokens=True).tokens
            ids = []
            for step in generator.generate_tokens(
                prompt, max_length=n, sampling_topk=1, end_token=END_TOKENS
            ):
                if step.token in END_TOKENS:
                    break
                ids.append(step.token_id)
            text = tokenizer.decode(ids, skip_special_tokens=True)
            out[str(n)].append(time.perf_counter() - started)
            tokens[str(n)] = len(ids)
            assert text is not None
    out["tokens"] = tokens
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
