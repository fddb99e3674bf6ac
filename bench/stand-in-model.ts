/**
 * A stand-in of the pinned model at its real size: Qwen2.5-0.5B-Instruct
 * Q4_K_M's architecture, hyperparameters, tensor shapes and tensor types,
 * the real Qwen2 tokenizer and chat template, and seeded random weights.
 * llama.cpp's cost does not depend on the weights' values, so the stand-in
 * costs what the real file costs; its answers mean nothing. It is made at
 * bench time in a cache folder (never in the repository) and says in its
 * metadata that its weights are random.
 *
 * Sources: the vocabulary and merges are llama.cpp's own Qwen2 tokenizer test
 * file (`models/ggml-vocab-qwen2.gguf`) and the template is
 * `models/templates/Qwen-Qwen2.5-7B-Instruct.jinja` (the Qwen2.5 Instruct
 * template), both read from the llama.cpp source that node-llama-cpp ships as
 * a git bundle. Tensor types are what llama.cpp's quantizer
 * (`src/llama-quant.cpp`) gives a Q4_K_M file of this shape: Q6_K for
 * `attn_v` and `ffn_down` in the layers `use_more_bits` picks, Q4_K
 * elsewhere; every tensor whose rows (896) are not a multiple of 256 falls
 * back (Q4_K to Q5_0, Q6_K to Q8_0), so only `ffn_down` (rows of 4,864) keeps
 * K-quants. Qwen's file carries `output.weight` beside `token_embd.weight`
 * (the tied embedding written twice): with it the stand-in's size is the
 * pinned file's size to within its metadata's difference.
 */
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { ggufHeader, GGUF_ALIGNMENT, type GgufTensorInfo, type Kv } from "../test/support/tiny-gguf.js";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const BUNDLE = path.join(ROOT, "node_modules/node-llama-cpp/llama/gitRelease.bundle");

/** Bump when the bytes written change, so a cached file of an older recipe is not reused. */
const RECIPE = 1;
const SEED = 20261128;

const N_EMBD = 896;
const N_LAYER = 24;
const N_HEAD = 14;
const N_HEAD_KV = 2;
const N_FF = 4864;
const N_VOCAB = 151_936;
const KV_DIM = (N_EMBD / N_HEAD) * N_HEAD_KV;

/** GGML types and their blocks (weights per block, bytes per block), from ggml's type traits. */
const TYPES = {
  F32: { id: 0, weights: 1, bytes: 4 },
  Q5_0: { id: 6, weights: 32, bytes: 22 },
  Q8_0: { id: 8, weights: 32, bytes: 34 },
  Q4_K: { id: 12, weights: 256, bytes: 144 },
  Q6_K: { id: 14, weights: 256, bytes: 210 },
} as const;
type TypeName = keyof typeof TYPES;

/** llama.cpp's `use_more_bits`: the layers Q4_K_M gives more bits in `attn_v` and `ffn_down`. */
const useMoreBits = (layer: number, layers: number) => layer < layers / 8 || layer >= (7 * layers) / 8 || (layer - Math.floor(layers / 8)) % 3 === 2;

interface Tensor {
  name: string;
  dims: number[];
  type: TypeName;
}

function tensors(): Tensor[] {
  const list: Tensor[] = [
    { name: "token_embd.weight", dims: [N_EMBD, N_VOCAB], type: "Q5_0" },
    { name: "output_norm.weight", dims: [N_EMBD], type: "F32" },
    { name: "output.weight", dims: [N_EMBD, N_VOCAB], type: "Q8_0" },
  ];
  for (let l = 0; l < N_LAYER; l++) {
    const p = `blk.${l}.`;
    const more = useMoreBits(l, N_LAYER);
    list.push(
      { name: `${p}attn_norm.weight`, dims: [N_EMBD], type: "F32" },
      { name: `${p}attn_q.weight`, dims: [N_EMBD, N_EMBD], type: "Q5_0" },
      { name: `${p}attn_q.bias`, dims: [N_EMBD], type: "F32" },
      { name: `${p}attn_k.weight`, dims: [N_EMBD, KV_DIM], type: "Q5_0" },
      { name: `${p}attn_k.bias`, dims: [KV_DIM], type: "F32" },
      { name: `${p}attn_v.weight`, dims: [N_EMBD, KV_DIM], type: more ? "Q8_0" : "Q5_0" },
      { name: `${p}attn_v.bias`, dims: [KV_DIM], type: "F32" },
      { name: `${p}attn_output.weight`, dims: [N_EMBD, N_EMBD], type: "Q5_0" },
      { name: `${p}ffn_norm.weight`, dims: [N_EMBD], type: "F32" },
      { name: `${p}ffn_gate.weight`, dims: [N_EMBD, N_FF], type: "Q5_0" },
      { name: `${p}ffn_up.weight`, dims: [N_EMBD, N_FF], type: "Q5_0" },
      { name: `${p}ffn_down.weight`, dims: [N_FF, N_EMBD], type: more ? "Q6_K" : "Q4_K" },
    );
  }
  return list;
}

const byteSize = (t: Tensor) => (t.dims.reduce((a, b) => a * b, 1) / TYPES[t.type].weights) * TYPES[t.type].bytes;

/** IEEE half-precision bits of `value` (normal and subnormal, no rounding subtleties needed here). */
function f16(value: number): number {
  const f = new Float32Array([value]);
  const bits = new Uint32Array(f.buffer)[0]!;
  const sign = (bits >>> 16) & 0x8000;
  const exponent = ((bits >>> 23) & 0xff) - 127 + 15;
  const mantissa = bits & 0x7fffff;
  if (exponent <= 0) return sign | ((mantissa | 0x800000) >>> (14 - exponent));
  return sign | (exponent << 10) | (mantissa >>> 13);
}

/** xorshift128: seeded, fast enough for half a gigabyte. */
function fillRandom(target: Buffer, state: Uint32Array): void {
  const words = new Uint32Array(target.buffer, target.byteOffset, target.byteLength >>> 2);
  let [x, y, z, w] = state as unknown as [number, number, number, number];
  for (let i = 0; i < words.length; i++) {
    const t = x ^ (x << 11);
    x = y;
    y = z;
    z = w;
    w = (w ^ (w >>> 19) ^ (t ^ (t >>> 8))) >>> 0;
    words[i] = w;
  }
  state.set([x, y, z, w]);
}

/**
 * Random quantized blocks with their scales set to small finite values, so
 * activations stay finite (random scale bits would make NaNs and infinities)
 * and weights are about the size a trained model's are.
 */
function tensorData(t: Tensor, state: Uint32Array): Buffer {
  const data = Buffer.alloc(Math.ceil(byteSize(t) / 4) * 4);
  if (t.type === "F32") {
    // Norm weights 1, biases 0.
    const ones = t.name.endsWith("norm.weight");
    new Float32Array(data.buffer, data.byteOffset, data.byteLength / 4).fill(ones ? 1 : 0);
    return data.subarray(0, byteSize(t));
  }
  fillRandom(data, state);
  const { bytes } = TYPES[t.type];
  const blocks = byteSize(t) / bytes;
  for (let b = 0; b < blocks; b++) {
    const at = b * bytes;
    switch (t.type) {
      case "Q5_0":
        data.writeUInt16LE(f16(0.0022), at);
        break;
      case "Q8_0":
        data.writeUInt16LE(f16(0.00027), at);
        break;
      case "Q4_K":
        data.writeUInt16LE(f16(0.00014), at);
        data.writeUInt16LE(f16(0.001), at + 2);
        break;
      case "Q6_K":
        data.writeUInt16LE(f16(0.000015), at + 208);
        break;
    }
  }
  return data.subarray(0, byteSize(t));
}

/** The tokenizer and chat template from llama.cpp's source in node-llama-cpp's bundle. */
async function realTokenizer(): Promise<{ kvs: Kv[] }> {
  const scratch = fs.mkdtempSync(path.join(os.tmpdir(), "typesafe-llama-src-"));
  try {
    execFileSync("git", ["clone", "--quiet", "--no-checkout", BUNDLE, scratch], { stdio: "ignore" });
    const show = (file: string) => execFileSync("git", ["-C", scratch, "show", `HEAD:${file}`], { maxBuffer: 64 << 20 });
    const vocabFile = path.join(scratch, "vocab.gguf");
    fs.writeFileSync(vocabFile, show("models/ggml-vocab-qwen2.gguf"));
    const template = show("models/templates/Qwen-Qwen2.5-7B-Instruct.jinja").toString("utf8");
    const { readGgufFileInfo } = await import("node-llama-cpp");
    const info = await readGgufFileInfo(vocabFile, { readTensorInfo: false });
    const ggml = info.metadata.tokenizer.ggml as unknown as { tokens: string[]; token_type: number[]; merges: string[] };
    if (ggml.tokens.length !== N_VOCAB) throw new Error(`the Qwen2 vocabulary has ${ggml.tokens.length} tokens, expected ${N_VOCAB}`);
    return {
      kvs: [
        ["tokenizer.ggml.model", "str", "gpt2"],
        ["tokenizer.ggml.pre", "str", "qwen2"],
        ["tokenizer.ggml.tokens", "strs", ggml.tokens],
        ["tokenizer.ggml.token_type", "i32s", ggml.token_type],
        ["tokenizer.ggml.merges", "strs", ggml.merges],
        // Qwen2.5 Instruct's: <|im_end|> ends a turn, <|endoftext|> pads; no BOS is added.
        ["tokenizer.ggml.eos_token_id", "u32", 151_645],
        ["tokenizer.ggml.padding_token_id", "u32", 151_643],
        ["tokenizer.ggml.bos_token_id", "u32", 151_643],
        ["tokenizer.ggml.add_bos_token", "bool", false],
        ["tokenizer.chat_template", "str", template],
      ],
    };
  } finally {
    fs.rmSync(scratch, { recursive: true, force: true });
  }
}

/** The stand-in's path, written once into the cache folder (about 490 MB, about 10 s). */
export async function standInModelFile(cacheDir = path.join(os.tmpdir(), "typesafe-bench-models")): Promise<string> {
  const file = path.join(cacheDir, `qwen2.5-0.5b-instruct-q4_k_m-shape-random-r${RECIPE}.gguf`);
  if (fs.existsSync(file)) return file;
  fs.mkdirSync(cacheDir, { recursive: true });
  const { kvs: tokenizer } = await realTokenizer();
  const kvs: Kv[] = [
    ["general.architecture", "str", "qwen2"],
    ["general.name", "str", "Qwen2.5-0.5B-Instruct Q4_K_M shape, RANDOM WEIGHTS (typesafe bench stand-in)"],
    ["general.description", "str", "Random seeded weights in the shape of Qwen2.5-0.5B-Instruct Q4_K_M, for measuring speed only; its answers mean nothing."],
    ["general.file_type", "u32", 15],
    ["general.quantization_version", "u32", 2],
    ["general.alignment", "u32", GGUF_ALIGNMENT],
    ["typesafe.random_weights", "bool", true],
    ["typesafe.random_seed", "u32", SEED],
    ["qwen2.block_count", "u32", N_LAYER],
    ["qwen2.context_length", "u32", 32_768],
    ["qwen2.embedding_length", "u32", N_EMBD],
    ["qwen2.feed_forward_length", "u32", N_FF],
    ["qwen2.attention.head_count", "u32", N_HEAD],
    ["qwen2.attention.head_count_kv", "u32", N_HEAD_KV],
    ["qwen2.rope.freq_base", "f32", 1_000_000],
    ["qwen2.attention.layer_norm_rms_epsilon", "f32", 1e-6],
    ...tokenizer,
  ];
  const list = tensors();
  const infos: GgufTensorInfo[] = list.map((t) => ({ name: t.name, dims: t.dims, type: TYPES[t.type].id, bytes: byteSize(t) }));
  const partial = `${file}.${process.pid}.part`;
  const fd = fs.openSync(partial, "w");
  try {
    fs.writeSync(fd, ggufHeader(kvs, infos));
    const state = Uint32Array.from([SEED, 0x9e3779b9, 0x243f6a88, 0xb7e15162]);
    for (const t of list) {
      const data = tensorData(t, state);
      fs.writeSync(fd, data);
      const rest = data.byteLength % GGUF_ALIGNMENT;
      if (rest) fs.writeSync(fd, Buffer.alloc(GGUF_ALIGNMENT - rest));
    }
  } finally {
    fs.closeSync(fd);
  }
  fs.renameSync(partial, file);
  return file;
}

/** The Q4_K_M types per tensor kind, for the bench's header line. */
export function standInTypes(): string {
  const counts = new Map<string, number>();
  for (const t of tensors()) counts.set(t.type, (counts.get(t.type) ?? 0) + 1);
  return [...counts].map(([type, n]) => `${n} ${type}`).join(", ");
}
