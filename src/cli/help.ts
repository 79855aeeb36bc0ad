/**
 * `tensorlink --help` and `tensorlink COMMAND --help`, made from the declarations (spec.ts, options.ts): nothing here is
 * written for one command.
 */
import type { OptionSpec, Options } from './options.ts';
import { acceptedOptions, COMMANDS, type CommandSpec } from './spec.ts';

const TITLE = 'tensorlink: decentralized training and inference of neural networks';

/** The column option help starts at (longer flags push it on). */
const HELP_COLUMN = 34;

/** The overview: every command with its summary. */
export function overviewHelp(commands: readonly CommandSpec[] = COMMANDS): string {
  const width = Math.max(...commands.map((c) => c.name.length)) + 2;
  return [
    TITLE,
    '',
    'usage: tensorlink <command> [options]',
    '',
    'commands:',
    ...commands.map((c) => `  ${c.name.padEnd(width)}${c.summary}`),
    '',
    'tensorlink <command> --help lists every option of a command; --version prints the version',
  ].join('\n');
}

/** `--NAME VALUE` as the help shows an option. */
export function optionUsage(name: string, option: OptionSpec): string {
  return option.value === undefined ? `--${name}` : `--${name} ${option.value}`;
}

/** What the option's value is and its default, after its help: "[integer ≥ 1; default 600]". */
function optionFacts(option: OptionSpec): string {
  const facts: string[] = [];
  if (option.kind === 'int') facts.push(`integer ≥ ${option.min ?? 0}`);
  else if (option.kind === 'number') facts.push(`number ≥ ${option.min ?? 0}`);
  else if (option.kind === 'bytes') facts.push('a size: 4GiB, 512MiB, bytes');
  else if (option.kind === 'list') facts.push('comma-separated');
  else if (option.kind === 'repeatable') facts.push('repeatable');
  if (option.default !== undefined) facts.push(`default ${String(option.default)}`);
  return facts.length > 0 ? ` [${facts.join('; ')}]` : '';
}

/** One option's line: its usage, then its help and facts from HELP_COLUMN on. */
function optionLine(name: string, option: OptionSpec): string {
  const usage = `  ${optionUsage(name, option)}`;
  const gap = usage.length < HELP_COLUMN - 1 ? ' '.repeat(HELP_COLUMN - usage.length) : `\n${' '.repeat(HELP_COLUMN)}`;
  return `${usage}${gap}${option.help}${optionFacts(option)}`;
}

/** The options under their headings: the command's own first, then each group in the order the command names them. */
function optionSections(options: Options): string[] {
  const headings = new Map<string, string[]>();
  for (const [name, option] of Object.entries(options)) {
    const heading = option.group ?? 'options';
    if (!headings.has(heading)) headings.set(heading, []);
    headings.get(heading)!.push(optionLine(name, option));
  }
  const order = ['options', ...[...headings.keys()].filter((h) => h !== 'options')];
  return order.filter((h) => headings.has(h)).flatMap((h) => ['', `${h}:`, ...headings.get(h)!]);
}

/** A command's help: its usage (each form of the words after its name), what it does, every option it accepts. */
export function commandHelp(command: CommandSpec): string {
  const forms = command.positionals ?? [{ usage: '', help: '' }];
  const usage = forms.map((f, i) => `${i === 0 ? 'usage: ' : '       '}tensorlink ${command.name}${f.usage ? ` ${f.usage}` : ''} [options]`);
  const words = command.positionals && command.positionals.length > 1
    ? ['', ...command.positionals.map((f) => `  ${command.name} ${f.usage}\n      ${f.help}`)]
    : command.positionals ? ['', ...command.positionals.map((f) => `  ${f.usage}: ${f.help}`)] : [];
  return [
    ...usage,
    '',
    command.summary,
    ...(command.description ?? []),
    ...words,
    ...optionSections(acceptedOptions(command)),
  ].join('\n');
}
