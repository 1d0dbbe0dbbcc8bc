// Reference encoder for engine/tokenizers/bpe_tokenizer_test.cc: Hugging Face tokenizers (the
// native node build @anush008/tokenizers, installed by scripts/fetch-test-tokenizers.sh).
//   node tests/tokenizer_reference.js DEST TOKENIZER_JSON IN_JSON OUT_JSON
// IN_JSON is a JSON array of strings. OUT_JSON gets {"ids": [[...], ...], "decoded": [s, ...]}:
// each string encoded without added special tokens (addSpecialTokens=false; special tokens in the
// text are still matched) and the ids decoded back with skipSpecialTokens=false.
'use strict';
const fs = require('fs');
const path = require('path');

async function main() {
  const [dest, tokenizerJson, inJson, outJson] = process.argv.slice(2);
  if (!outJson) {
    console.error('usage: tokenizer_reference.js DEST TOKENIZER_JSON IN_JSON OUT_JSON');
    process.exit(2);
  }
  const { Tokenizer } = require(path.join(path.resolve(dest), 'node_modules', '@anush008', 'tokenizers'));
  const tok = Tokenizer.fromFile(tokenizerJson);
  const texts = JSON.parse(fs.readFileSync(inJson, 'utf8'));
  const ids = [];
  const decoded = [];
  for (const t of texts) {
    const enc = await tok.encode(t, null, { addSpecialTokens: false });
    const e = Array.from(enc.getIds());
    ids.push(e);
    decoded.push(await tok.decode(e, false));
  }
  fs.writeFileSync(outJson, JSON.stringify({ ids, decoded }));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
