// GPT-2's tokenizer as OpenAI's tiktoken (its Rust core, compiled to WASM in the
// npm package) encodes it: the reference for tokenizer_test's differential tests.
// Reads one JSON string per line, writes one JSON array of ids per line;
// "<|endoftext|>" in the text is the special id, as troupe's encode has it.
//   NODE_PATH=.tools/node/node_modules node tiktoken_encode.cjs < texts.jsonl > ids.jsonl
const fs = require('fs');
const { get_encoding } = require('tiktoken');

const gpt2 = get_encoding('gpt2');
const out = [];
for (const line of fs.readFileSync(0, 'utf8').split('\n')) {
  if (line.length > 0) out.push(JSON.stringify(Array.from(gpt2.encode(JSON.parse(line), 'all'))));
}
gpt2.free();
fs.writeSync(1, out.join('\n') + '\n');  // whole, before exiting
