import fs from "node:fs";

/**
 * Writes a tiny GGUF model that llama.cpp loads like any llama model: the
 * llama architecture, a SentencePiece vocabulary of control tokens, 256 byte
 * tokens (so any text tokenizes) and a few dozen pieces, a ChatML template,
 * and fixed pseudo-random F32 weights. Its answers mean nothing; what tests
 * check is that the service reads the engine's distribution exactly.
 * Layout: the GGUF v3 specification (ggml's docs/gguf.md); tensor names and
 * shapes: llama.cpp's LLM_ARCH_LLAMA tensor list.
 */

const N_EMBD = 32;
const N_HEAD = 4;
const N_HEAD_KV = 2;
const N_FF = 64;
const N_LAYER = 2;
const CONTEXT = 4096;
const ALIGNMENT = 32;
/** The alignment every GGUF file here uses (the format's default). */
export const GGUF_ALIGNMENT = ALIGNMENT;

/** The ChatML template (as Qwen2.5 ships it, without tool calls). */
export const TINY_CHAT_TEMPLATE =
  "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}" +
  "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

const enum TokenType {
  Normal = 1,
  Unknown = 2,
  Control = 3,
  Byte = 6,
}

/** Pieces beyond single characters: label spellings with and without a leading space, so variants exist. */
const WORDS = ["ye", "yes", "Ye", "Yes", "YES", "no", "No", "NO", "▁yes", "▁Yes", "▁no", "▁No", "▁A", "▁B", "▁C", "▁1", "▁2", "ma", "may", "be"];

export function tinyVocabulary(): Array<{ text: string; type: TokenType; score: number }> {
  const tokens: Array<{ text: string; type: TokenType; score: number }> = [
    { text: "<unk>", type: TokenType.Unknown, score: 0 },
    { text: "<s>", type: TokenType.Control, score: 0 },
    { text: "</s>", type: TokenType.Control, score: 0 },
    { text: "<|im_start|>", type: TokenType.Control, score: 0 },
    { text: "<|im_end|>", type: TokenType.Control, score: 0 },
  ];
  for (let b = 0; b < 256; b++) tokens.push({ text: `<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`, type: TokenType.Byte, score: 0 });
  const chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789▁";
  for (const c of chars) tokens.push({ text: c, type: TokenType.Normal, score: -1 });
  for (const w of WORDS) tokens.push({ text: w, type: TokenType.Normal, score: w.length });
  return tokens;
}

class Writer {
  private chunks: Buffer[] = [];
  length = 0;
  private push(b: Buffer) {
    this.chunks.push(b);
    this.length += b.length;
  }
  u32(v: number) {
    const b = Buffer.alloc(4);
    b.writeUInt32LE(v);
    this.push(b);
  }
  i32(v: number) {
    const b = Buffer.alloc(4);
    b.writeInt32LE(v);
    this.push(b);
  }
  u64(v: number) {
    const b = Buffer.alloc(8);
    b.writeBigUInt64LE(BigInt(v));
    this.push(b);
  }
  f32(v: number) {
    const b = Buffer.alloc(4);
    b.writeFloatLE(v);
    this.push(b);
  }
  bool(v: boolean) {
    this.push(Buffer.from([v ? 1 : 0]));
  }
  str(s: string) {
    const b = Buffer.from(s, "utf8");
    this.u64(b.length);
    this.push(b);
  }
  raw(b: Buffer) {
    this.push(b);
  }
  pad(to: number) {
    const rest = this.length % to;
    if (rest) this.push(Buffer.alloc(to - rest));
  }
  buffer() {
    return Buffer.concat(this.chunks);
  }
}

const enum GgufType {
  U32 = 4,
  I32 = 5,
  F32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
}

export type Kv =
  | [string, "u32", number]
  | [string, "f32", number]
  | [string, "bool", boolean]
  | [string, "str", string]
  | [string, "strs", string[]]
  | [string, "f32s", number[]]
  | [string, "i32s", number[]];

/** A tensor as the header describes it: its GGML type (0 is F32) and its size in bytes. */
export interface GgufTensorInfo {
  name: string;
  dims: number[];
  type: number;
  bytes: number;
}

/**
 * The header of a GGUF v3 file up to its tensor data: magic, counts, the
 * key-value pairs and the tensor infos, each tensor's data at the next
 * multiple of ALIGNMENT. The data follows, each tensor padded to ALIGNMENT.
 */
export function ggufHeader(kvs: readonly Kv[], tensors: readonly GgufTensorInfo[]): Buffer {
  const w = new Writer();
  w.raw(Buffer.from("GGUF", "ascii"));
  w.u32(3);
  w.u64(tensors.length);
  w.u64(kvs.length);
  for (const [key, kind, value] of kvs) {
    w.str(key);
    switch (kind) {
      case "u32":
        w.u32(GgufType.U32);
        w.u32(value);
        break;
      case "f32":
        w.u32(GgufType.F32);
        w.f32(value);
        break;
      case "bool":
        w.u32(GgufType.BOOL);
        w.bool(value);
        break;
      case "str":
        w.u32(GgufType.STRING);
        w.str(value);
        break;
      case "strs":
        w.u32(GgufType.ARRAY);
        w.u32(GgufType.STRING);
        w.u64(value.length);
        for (const s of value) w.str(s);
        break;
      case "f32s":
        w.u32(GgufType.ARRAY);
        w.u32(GgufType.F32);
        w.u64(value.length);
        for (const v of value) w.f32(v);
        break;
      case "i32s":
        w.u32(GgufType.ARRAY);
        w.u32(GgufType.I32);
        w.u64(value.length);
        for (const v of value) w.i32(v);
        break;
    }
  }
  let offset = 0;
  for (const t of tensors) {
    w.str(t.name);
    w.u32(t.dims.length);
    for (const d of t.dims) w.u64(d);
    w.u32(t.type);
    w.u64(offset);
    offset += Math.ceil(t.bytes / GGUF_ALIGNMENT) * GGUF_ALIGNMENT;
  }
  w.pad(GGUF_ALIGNMENT);
  return w.buffer();
}

/** A fixed generator (mulberry32), so every run writes the same bytes. */
export function prng(seed: number) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** The GGUF bytes of the tiny model; the same bytes on every call. */
export function tinyGgufBytes(): Buffer {
  const vocab = tinyVocabulary();
  const nVocab = vocab.length;
  const headDim = N_EMBD / N_HEAD;
  const kvDim = headDim * N_HEAD_KV;
  const kvs: Kv[] = [
    ["general.architecture", "str", "llama"],
    ["general.name", "str", "typesafe-tiny-test"],
    ["general.alignment", "u32", ALIGNMENT],
    ["llama.context_length", "u32", CONTEXT],
    ["llama.embedding_length", "u32", N_EMBD],
    ["llama.block_count", "u32", N_LAYER],
    ["llama.feed_forward_length", "u32", N_FF],
    ["llama.attention.head_count", "u32", N_HEAD],
    ["llama.attention.head_count_kv", "u32", N_HEAD_KV],
    ["llama.attention.layer_norm_rms_epsilon", "f32", 1e-5],
    ["llama.rope.dimension_count", "u32", headDim],
    ["llama.rope.freq_base", "f32", 10000],
    ["llama.vocab_size", "u32", nVocab],
    ["tokenizer.ggml.model", "str", "llama"],
    ["tokenizer.ggml.tokens", "strs", vocab.map((t) => t.text)],
    ["tokenizer.ggml.scores", "f32s", vocab.map((t) => t.score)],
    ["tokenizer.ggml.token_type", "i32s", vocab.map((t) => t.type)],
    ["tokenizer.ggml.unknown_token_id", "u32", 0],
    ["tokenizer.ggml.bos_token_id", "u32", 1],
    ["tokenizer.ggml.eos_token_id", "u32", 4],
    ["tokenizer.ggml.add_bos_token", "bool", false],
    ["tokenizer.ggml.add_space_prefix", "bool", false],
    ["tokenizer.chat_template", "str", TINY_CHAT_TEMPLATE],
  ];
  const random = prng(20261127);
  const weights = (count: number, scale: number) => Float32Array.from({ length: count }, () => (random() * 2 - 1) * scale);
  const ones = (count: number) => new Float32Array(count).fill(1);
  const tensors: Array<{ name: string; dims: number[]; data: Float32Array }> = [
    { name: "token_embd.weight", dims: [N_EMBD, nVocab], data: weights(N_EMBD * nVocab, 1) },
    { name: "output_norm.weight", dims: [N_EMBD], data: ones(N_EMBD) },
    { name: "output.weight", dims: [N_EMBD, nVocab], data: weights(N_EMBD * nVocab, 0.5) },
  ];
  for (let l = 0; l < N_LAYER; l++) {
    const p = `blk.${l}.`;
    tensors.push(
      { name: `${p}attn_norm.weight`, dims: [N_EMBD], data: ones(N_EMBD) },
      { name: `${p}attn_q.weight`, dims: [N_EMBD, N_EMBD], data: weights(N_EMBD * N_EMBD, 0.3) },
      { name: `${p}attn_k.weight`, dims: [N_EMBD, kvDim], data: weights(N_EMBD * kvDim, 0.3) },
      { name: `${p}attn_v.weight`, dims: [N_EMBD, kvDim], data: weights(N_EMBD * kvDim, 0.3) },
      { name: `${p}attn_output.weight`, dims: [N_EMBD, N_EMBD], data: weights(N_EMBD * N_EMBD, 0.3) },
      { name: `${p}ffn_norm.weight`, dims: [N_EMBD], data: ones(N_EMBD) },
      { name: `${p}ffn_gate.weight`, dims: [N_EMBD, N_FF], data: weights(N_EMBD * N_FF, 0.3) },
      { name: `${p}ffn_up.weight`, dims: [N_EMBD, N_FF], data: weights(N_EMBD * N_FF, 0.3) },
      { name: `${p}ffn_down.weight`, dims: [N_FF, N_EMBD], data: weights(N_FF * N_EMBD, 0.3) },
    );
  }

  const w = new Writer();
  w.raw(ggufHeader(kvs, tensors.map((t) => ({ name: t.name, dims: t.dims, type: 0, bytes: t.data.byteLength }))));
  w.pad(ALIGNMENT);
  for (const t of tensors) {
    w.raw(Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength));
    w.pad(ALIGNMENT);
  }
  return w.buffer();
}

/** Writes the tiny model to `file` (once; same bytes every time) and returns the path. */
export function writeTinyGguf(file: string): string {
  fs.writeFileSync(file, tinyGgufBytes());
  return file;
}

/**
 * The settings that run a test service on the tiny model in `dir`: the embedded model on, one
 * thread, and a context that holds the tests' longest prompts.
 */
export function tinyModelSettings(modelFile: string, dir: string): Record<string, string> {
  return {
    TYPESAFE_LLM_EMBEDDED: "on",
    TYPESAFE_LLM_MODEL_PATH: modelFile,
    TYPESAFE_LLM_CONTEXT_TOKENS: "2048",
    TYPESAFE_LLM_THREADS: "1",
    TYPESAFE_DATA_DIR: dir,
  };
}
