import { createHash } from 'node:crypto';
import { packedToBytes, packMatrix, type WeightFormat } from '../../tensor/index.ts';
import { type ModelWeights, partWeightsOf, type WeightShape, yieldNow } from './checkpoint-weights.ts';
import type { ModelConfig } from '../config.ts';
import { configFromHF } from '../families/index.ts';
import { GGUFModel } from './gguf-model.ts';
import { compactWeight, weightBytes } from './hf.ts';
import type { ModelPart } from '../model.ts';

/**
 * A GGUF file (llama.cpp's, Ollama's) seen weight by weight, as a section is streamed from it to a worker, under
 * Hugging Face's names. A matrix of a compact job travels packed: a Q8_0, Q4_0 or BF16 tensor read as the same int8,
 * int4 or bf16 blocks when the job's format is its own (no rounding again), any other tensor dequantized and packed.
 * Everything else travels in float32. One weight is read at a time (the last two are kept, for the one sending and
 * the one hashed ahead); hashes are kept for the file's life.
 */
export class GGUFWeights implements ModelWeights {
  readonly config: ModelConfig;
  private readonly shapes: Map<string, number[]>;
  private readonly bytes = new Map<string, Uint8Array>();
  private readonly known = new Map<string, string[]>();

  private constructor(
    readonly path: string,
    private readonly file: GGUFModel,
    private readonly chunkBytes: number,
  ) {
    this.config = configFromHF(file.config);
    this.shapes = new Map(file.weights().map((w) => [w.name, w.shape]));
  }

  static open(path: string, options: { chunkBytes: number }): GGUFWeights {
    const file = GGUFModel.open(path);
    try {
      return new GGUFWeights(path, file, options.chunkBytes);
    } catch (err) {
      file.close();
      throw err;
    }
  }

  private shape(name: string): number[] {
    // an unknown name is refused by the file's reader, naming it
    return this.shapes.get(name) ?? this.file.read(name).shape.slice();
  }

  partWeights(part: ModelPart): WeightShape[] {
    return partWeightsOf(this.config, [...this.shapes].map(([name, shape]) => ({ name, shape })), part, this.path);
  }

  travelFormat(name: string, format: WeightFormat | null): WeightFormat | null {
    return format && compactWeight(name, this.shape(name)) ? format : null;
  }

  byteLength(name: string, format: WeightFormat | null = null): number {
    return weightBytes(name, this.shape(name), this.travelFormat(name, format));
  }

  /** A weight's bytes as it travels for a job held in `format`. */
  private travelBytes(name: string, format: WeightFormat | null): Uint8Array {
    const travel = this.travelFormat(name, format);
    const id = `${name}@${travel ?? 'f32'}`;
    const kept = this.bytes.get(id);
    if (kept) return kept;
    let bytes: Uint8Array;
    if (travel) {
      const own = this.file.readPacked(name);
      const [rows, cols] = this.shape(name);
      bytes = packedToBytes(own && own.format === travel ? own : packMatrix(this.file.read(name).data, rows, cols, travel));
    } else {
      const data = this.file.read(name).data;
      bytes = new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
    }
    if (this.bytes.size >= 2) this.bytes.delete(this.bytes.keys().next().value!);
    this.bytes.set(id, bytes);
    return bytes;
  }

  chunk(name: string, index: number, _scratch?: Float32Array, format: WeightFormat | null = null): Uint8Array {
    const bytes = this.travelBytes(name, format);
    return bytes.subarray(index * this.chunkBytes, Math.min(bytes.byteLength, (index + 1) * this.chunkBytes));
  }

  async hashes(name: string, format: WeightFormat | null = null): Promise<string[]> {
    const id = `${name}@${this.travelFormat(name, format) ?? 'f32'}`;
    const known = this.known.get(id);
    if (known) return known;
    const bytes = this.travelBytes(name, format);
    const out: string[] = [];
    const count = Math.max(1, Math.ceil(bytes.byteLength / this.chunkBytes));
    for (let i = 0; i < count; i++) {
      out.push(createHash('sha256').update(this.chunk(name, i, undefined, format)).digest('hex'));
      await yieldNow();
    }
    this.known.set(id, out);
    return out;
  }

  close(): void {
    this.file.close();
  }
}
