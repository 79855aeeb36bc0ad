/**
 * A command line read against a command's declaration (spec.ts): node:util's parseArgs underneath, then every value
 * checked by its option's kind. A bad line is one UsageError naming the flag and what it takes.
 */
import { type ParseArgsConfig, parseArgs } from 'node:util';
import { type Flags, parseBytes, UsageError } from './args.ts';
import type { OptionSpec, Options } from './options.ts';
import { acceptedOptions, type CommandSpec } from './spec.ts';

/** What parseArgs takes for `options`: a switch is a boolean, a repeatable option a string given many times, the rest strings. */
export function parseArgsOptions(options: Options): NonNullable<ParseArgsConfig['options']> {
  return Object.fromEntries(Object.entries(options).map(([name, o]) => [
    name,
    o.kind === 'boolean' ? { type: 'boolean' as const } : o.kind === 'repeatable' ? { type: 'string' as const, multiple: true } : { type: 'string' as const },
  ]));
}

/** "a or b", or "one of a, b, c": what an enum takes, as the messages say it. */
export function choicesText(choices: readonly string[]): string {
  return choices.length === 2 ? `${choices[0]} or ${choices[1]}` : `one of ${choices.join(', ')}`;
}

/** Checks one option's value (as given on the command line) against its declaration. */
export function checkValue(name: string, option: OptionSpec, raw: string | boolean | (string | boolean)[]): void {
  if (option.kind === 'boolean' || option.kind === 'repeatable' || typeof raw !== 'string') return;
  if (raw === '') throw new UsageError(`--${name} needs a value`);
  const min = option.min ?? 0;
  switch (option.kind) {
    case 'int':
      if (!Number.isInteger(Number(raw)) || Number(raw) < min) throw new UsageError(`--${name} must be an integer ≥ ${min}, got '${raw}'`);
      return;
    case 'number':
      if (!Number.isFinite(Number(raw)) || Number(raw) < min) throw new UsageError(`--${name} must be a number ≥ ${min}, got '${raw}'`);
      return;
    case 'enum':
      // a lazy enum's values are checked once read (resolveCommand)
      if (option.choices && !option.choices.includes(raw)) throw new UsageError(`--${name} must be ${choicesText(option.choices)}, got '${raw}'`);
      return;
    case 'bytes':
      try {
        parseBytes(raw);
      } catch {
        throw new UsageError(`--${name} must be a size (e.g. 4GiB, 512MiB), got '${raw}'`);
      }
      return;
    default:
  }
}

/**
 * Reads `args` (what follows the command's name) as `command` declares: its flags (as given: strings, booleans and
 * lists of strings; a command applies its defaults) and the words after its name. With --help the values are not
 * checked: the help is shown whatever else the line says.
 * @example
 * const { flags } = parseCommand(commandSpec('demo')!, ['--steps', '20'])   // flags.steps === '20'
 */
export function parseCommand(command: CommandSpec, args: string[]): { flags: Flags; positionals: string[] } {
  const options = acceptedOptions(command);
  let parsed;
  try {
    parsed = parseArgs({ args, options: parseArgsOptions(options), strict: true, allowPositionals: command.positionals !== undefined });
  } catch (err) {
    throw new UsageError(parseArgsProblem(command, err as Error & { code?: string }));
  }
  const flags = parsed.values as Flags;
  if (flags.help !== true) {
    for (const [name, value] of Object.entries(parsed.values)) if (value !== undefined) checkValue(name, options[name], value);
  }
  return { flags, positionals: parsed.positionals };
}

/** parseArgs's complaint in the CLI's words: which flag or word, and where the command's options are listed. */
function parseArgsProblem(command: CommandSpec, err: Error & { code?: string }): string {
  const see = `(tensorlink ${command.name} --help lists what it takes)`;
  const quoted = /'(-{0,2}[^' ]+)/.exec(err.message)?.[1];
  if (err.code === 'ERR_PARSE_ARGS_UNKNOWN_OPTION' && quoted) return `${command.name} takes no option ${quoted} ${see}`;
  if (err.code === 'ERR_PARSE_ARGS_UNEXPECTED_POSITIONAL' && quoted) return `${command.name} takes no argument '${quoted}' ${see}`;
  if (err.code === 'ERR_PARSE_ARGS_INVALID_OPTION_VALUE' && quoted) {
    const name = quoted.replace(/^-+/, '');
    const option = acceptedOptions(command)[name];
    return option?.kind === 'boolean' ? `--${name} is a switch: it takes no value` : `--${name} needs a value${option?.value ? ` (${option.value})` : ''}`;
  }
  return `${err.message} ${see}`;
}
