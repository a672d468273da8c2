// Reference tokenizer for tier1/tokenize's TestOracle: independent
// JavaScript implementations, installed by scripts/tokenizer-oracle.sh.
//
//   node oracle.mjs <npm dir> <cases.json>
//
// cases.json: {"vocabs": [{"name", "tokenizer", "config", "cases": [{"text",
// "special"}]}]}; special: add the post-processor's tokens.
//
// Output (stdout): {"<name>": [{"ids", "lenml"}]}: ids from Tokenizers.js
// (@huggingface/tokenizers), lenml from @lenml/tokenizers (the
// transformers.js tokenizer) as a second opinion.
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";
import { join } from "node:path";

const [npmDir, casesFile] = process.argv.slice(2);
const require = createRequire(join(npmDir, "package.json"));
const { Tokenizer } = require("@huggingface/tokenizers");
const { TokenizerLoader } = require("@lenml/tokenizers");

const input = JSON.parse(readFileSync(casesFile, "utf8"));
const out = {};
for (const v of input.vocabs) {
  const tokenizerJSON = JSON.parse(readFileSync(v.tokenizer, "utf8"));
  const tokenizerConfig = JSON.parse(readFileSync(v.config, "utf8"));
  const tok = new Tokenizer(tokenizerJSON, tokenizerConfig);
  const lenml = TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
  out[v.name] = v.cases.map((c) => ({
    ids: tok.encode(c.text, { add_special_tokens: !!c.special }).ids,
    lenml: lenml.encode(c.text, { add_special_tokens: !!c.special }),
  }));
}
process.stdout.write(JSON.stringify(out));
