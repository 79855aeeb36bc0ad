import { InvalidArgumentError, StateDictError } from '../errors.ts';
import { compositeOp, type Device, deviceOf, noGrad, type Tensor } from '../tensor/index.ts';

/**
 * The base of every layer and model: named parameters and sub-modules, in the order
 * they were added, so that names are the checkpoint's names (`h.0.attn.c_attn.weight`)
 * and loading is a key-for-key copy.
 */
export class Module {
  training = true;
  /**
   * What the names of this module's own parameters start with, before their path: '' but for LoRA factors, which
   * are named as PEFT's files key them (`base_model.model.<module>.lora_A.weight`).
   */
  paramPrefix = '';
  private readonly ownParameters = new Map<string, Tensor>();
  private readonly ownModules = new Map<string, Module>();

  /** Registers a parameter (marks it as requiring grad) and returns it. */
  protected addParameter(name: string, value: Tensor): Tensor {
    this.checkName(name);
    value.requiresGrad = true;
    this.ownParameters.set(name, value);
    return value;
  }

  /** Registers a sub-module under `name` and returns it. */
  protected addModule<M extends Module>(name: string, module: M): M {
    this.checkName(name);
    this.ownModules.set(name, module);
    return module;
  }

  /** Takes a sub-module away (LoRA factors merged into their layer). */
  protected removeModule(name: string): void {
    this.ownModules.delete(name);
  }

  private checkName(name: string): void {
    if (name === '' || name.includes('.')) throw new InvalidArgumentError(`invalid parameter name '${name}'`);
    if (this.ownParameters.has(name) || this.ownModules.has(name)) {
      throw new InvalidArgumentError(`'${name}' is already registered`);
    }
  }

  /** Every (dotted name, module) pair below and including this one. */
  * namedModules(prefix = ''): Generator<[string, Module]> {
    yield [prefix, this];
    for (const [name, m] of this.ownModules) yield* m.namedModules(prefix ? `${prefix}.${name}` : name);
  }

  /**
   * Every (dotted name, parameter) pair. A tensor shared by two modules (tied weights)
   * appears once, under its first name, unless `includeShared` is set.
   */
  * namedParameters(prefix = '', includeShared = false): Generator<[string, Tensor]> {
    const seen = new Set<Tensor>();
    for (const [path, m] of this.namedModules(prefix)) {
      for (const [name, p] of m.ownParameters) {
        if (!includeShared && seen.has(p)) continue;
        seen.add(p);
        yield [`${m.paramPrefix}${path ? `${path}.${name}` : name}`, p];
      }
    }
  }

  parameters(): Tensor[] {
    return [...this.namedParameters()].map(([, p]) => p);
  }

  /** The parameters that are trained: those that require grad (a frozen base's are left out, its adapters' are not). */
  trainableParameters(): Tensor[] {
    return this.parameters().filter((p) => p.requiresGrad);
  }

  /**
   * Where this module's parameters live ('cpu': host memory; else a device backend's name); a
   * DeviceMismatchError when they are split across devices. A model's and a section's device.
   * @example
   * model.device // 'cpu'
   */
  get device(): Device {
    return deviceOf(this.parameters());
  }

  numParameters(): number {
    return this.parameters().reduce((n, p) => n + p.size, 0);
  }

  /** All parameters by name (tied ones under each of their names, as PyTorch). */
  stateDict(): Map<string, Tensor> {
    return new Map(this.namedParameters('', true));
  }

  /**
   * Copies values into the parameters, key for key. With `strict` (default) the key sets
   * must match exactly; shapes must always match. Errors name the offending keys.
   */
  loadStateDict(
    state: Map<string, Tensor> | Record<string, Tensor>,
    options: { strict?: boolean } = {},
  ): { missing: string[]; unexpected: string[] } {
    const entries = state instanceof Map ? state : new Map(Object.entries(state));
    const own = this.stateDict();
    const missing = [...own.keys()].filter((k) => !entries.has(k));
    const unexpected = [...entries.keys()].filter((k) => !own.has(k));
    if ((options.strict ?? true) && (missing.length > 0 || unexpected.length > 0)) {
      throw new StateDictError(
        `state dict does not match the module: missing [${missing.slice(0, 5).join(', ')}${missing.length > 5 ? ', ...' : ''}], unexpected [${unexpected.slice(0, 5).join(', ')}${unexpected.length > 5 ? ', ...' : ''}]`,
        { details: { missing, unexpected } },
      );
    }
    for (const [name, target] of own) {
      const src = entries.get(name);
      if (src === undefined) continue;
      if (src.size !== target.size || src.shape.some((d, i) => d !== target.shape[i])) {
        throw new StateDictError(
          `'${name}': checkpoint has shape [${src.shape}], module expects [${target.shape}]`,
          {
            details: { key: name, expected: target.shape, got: src.shape },
          },
        );
      }
    }
    noGrad(() => {
      for (const [name, target] of own) {
        const src = entries.get(name);
        if (src !== undefined)
          target.data.set(src.dtype === target.dtype ? src.data : src.to(target.dtype).data);
      }
    });
    return { missing, unexpected };
  }

  /** Sets training mode here and below (dropout is active only in training). */
  train(mode = true): this {
    for (const [, m] of this.namedModules()) m.training = mode;
    return this;
  }

  eval(): this {
    return this.train(false);
  }

  /** Clears every parameter's gradient (an op of a traced step, as an optimizer's zeroGrad). */
  zeroGrad(): void {
    zeroGradOp(this);
  }
}

const zeroGradOp = compositeOp('moduleZeroGrad', (m: Module): void => {
  for (const p of m.parameters()) p.grad = null;
});

/** An indexed list of sub-modules, named '0', '1', ... (PyTorch's nn.ModuleList). */
export class ModuleList<M extends Module = Module> extends Module {
  private readonly items: M[] = [];

  /**
   * @param firstIndex the name of the first module (a section of a model holds blocks
   * 4..7 under their checkpoint names h.4..h.7)
   */
  constructor(
    modules: M[] = [],
    readonly firstIndex = 0,
  ) {
    super();
    for (const m of modules) this.push(m);
  }

  push(module: M): void {
    this.addModule(String(this.firstIndex + this.items.length), module);
    this.items.push(module);
  }

  /** The module named `index` (its index in the whole model). */
  byIndex(index: number): M {
    return this.at(index - this.firstIndex);
  }

  at(i: number): M {
    const m = this.items[i < 0 ? this.items.length + i : i];
    if (m === undefined)
      throw new InvalidArgumentError(`index ${i} out of range (${this.items.length} modules)`);
    return m;
  }

  get length(): number {
    return this.items.length;
  }

  [Symbol.iterator](): Iterator<M> {
    return this.items[Symbol.iterator]();
  }
}
