"""hangar_bridge.text: incremental decoding, stop sequences, chat templates.

Run: python3 -m unittest discover -s crates/hangar-backend-bridge/worker/tests \
    -t crates/hangar-backend-bridge/worker
"""

import json
import os
import tempfile
import unittest

from tests import helpers  # noqa: F401 - puts the worker on sys.path
from hangar_bridge import BridgeError
from hangar_bridge.text import IncrementalDecoder, StopFilter, render_chat_template, thinking_kwargs


def byte_decoder(vocab):
    """A byte-level decode: invalid or incomplete UTF-8 becomes U+FFFD."""
    return lambda ids: b"".join(vocab[i] for i in ids).decode("utf-8", errors="replace")


def run(decoder, ids):
    pieces = [decoder.push(i) for i in ids]
    return pieces, decoder.flush()


class IncrementalDecoderTest(unittest.TestCase):
    def test_multibyte_characters_split_across_tokens(self):
        text = "é日本🙂!"
        data = text.encode("utf-8")
        vocab = [bytes([b]) for b in data]  # one byte per token
        pieces, tail = run(IncrementalDecoder(byte_decoder(vocab)), range(len(vocab)))
        self.assertEqual("".join(pieces) + tail, text)
        for piece in pieces:
            self.assertNotIn("\ufffd", piece)
        self.assertEqual([p for p in pieces if p], ["é", "日", "本", "🙂", "!"])

    def test_incomplete_tail_is_dropped_at_flush(self):
        vocab = [b"ok", "é".encode()[:1]]
        pieces, tail = run(IncrementalDecoder(byte_decoder(vocab)), [0, 1])
        self.assertEqual(pieces, ["ok", ""])
        self.assertEqual(tail, "")

    def test_context_dependent_leading_space(self):
        # SentencePiece-like: "▁" is a space, but not at the start of the decoded text.
        vocab = ["▁Hello", "▁world", "!"]

        def decode(ids):
            return "".join(vocab[i] for i in ids).replace("▁", " ").lstrip(" ")

        pieces, tail = run(IncrementalDecoder(decode), [0, 1, 2])
        self.assertEqual("".join(pieces) + tail, "Hello world!")
        self.assertEqual(pieces, ["Hello", " world", "!"])

    def test_special_tokens_that_decode_to_nothing(self):
        vocab = [b"a", b"", b"b"]
        pieces, tail = run(IncrementalDecoder(byte_decoder(vocab)), [0, 1, 2])
        self.assertEqual("".join(pieces) + tail, "ab")


class StopFilterTest(unittest.TestCase):
    def feed(self, stops, pieces):
        f = StopFilter(stops)
        out = []
        for piece in pieces:
            text, stopped = f.push(piece)
            out.append(text)
            if stopped:
                return out, True
        out.append(f.flush())
        return out, False

    def test_no_stops_passes_through(self):
        self.assertEqual(self.feed([], ["a", "b"]), (["a", "b", ""], False))

    def test_stop_split_across_pieces(self):
        out, stopped = self.feed(["STOP"], ["Hello S", "TO", "P and more"])
        self.assertTrue(stopped)
        self.assertEqual(out, ["Hello ", "", ""])

    def test_held_prefix_released_when_it_diverges(self):
        out, stopped = self.feed(["STOP"], ["ab ST", "ORM"])
        self.assertFalse(stopped)
        self.assertEqual("".join(out), "ab STORM")
        self.assertEqual(out[0], "ab ")

    def test_held_prefix_flushed_at_the_end(self):
        out, stopped = self.feed(["\n\n"], ["line\n"])
        self.assertFalse(stopped)
        self.assertEqual(out, ["line", "\n"])

    def test_earliest_stop_wins(self):
        out, stopped = self.feed(["world", "lo"], ["hello world"])
        self.assertTrue(stopped)
        self.assertEqual(out, ["hel"])

    def test_the_stop_met_is_named_by_its_place_in_the_request(self):
        f = StopFilter(["", "never", "wor"])
        self.assertEqual(f.push("hello "), ("hello ", False))
        self.assertIsNone(f.met)
        self.assertEqual(f.push("world"), ("", True))
        self.assertEqual(f.met, 2)

    def test_stop_inside_one_piece(self):
        out, stopped = self.feed(["</s>"], ["abc</s>def"])
        self.assertEqual((out, stopped), (["abc"], True))

    def test_empty_stop_strings_are_ignored(self):
        self.assertEqual(self.feed([""], ["x"]), (["x", ""], False))


class ChatTemplateTest(unittest.TestCase):
    def test_thinking_kwargs(self):
        self.assertEqual(thinking_kwargs("default"), {})
        self.assertEqual(thinking_kwargs(None), {})
        self.assertEqual(thinking_kwargs("enabled"), {"enable_thinking": True})
        self.assertEqual(thinking_kwargs("disabled"), {"enable_thinking": False})

    def test_no_template_is_invalid_request(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
                json.dump({"eos_token": "</s>"}, f)
            with self.assertRaises(BridgeError) as e:
                render_chat_template(d, [{"role": "user", "content": "hi"}], "default")
            self.assertEqual(e.exception.code, "invalid_request")
            self.assertIn("prompt_format", e.exception.message)

    def test_template_renders_with_enable_thinking(self):
        try:
            import jinja2  # noqa: F401
        except ImportError:
            self.skipTest("jinja2 is not installed")
        template = (
            "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
            "{% if enable_thinking is defined and enable_thinking is false %}"
            "<think>\n\n</think>\n\n{% endif %}{% endif %}"
        )
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
                json.dump({"chat_template": template}, f)
            messages = [{"role": "user", "content": "hi"}]
            off = render_chat_template(d, messages, "disabled")
            on = render_chat_template(d, messages, "enabled")
        self.assertTrue(off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n"))
        self.assertTrue(on.endswith("<|im_start|>assistant\n"))


if __name__ == "__main__":
    unittest.main()
