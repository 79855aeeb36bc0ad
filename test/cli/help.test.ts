import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { commandHelp, overviewHelp } from '../../src/cli/help.ts';
import type { OptionSpec } from '../../src/cli/options.ts';
import { parseArgsOptions, parseCommand } from '../../src/cli/parse.ts';
import { acceptedOptions, COMMANDS, type CommandSpec, resolveCommand } from '../../src/cli/spec.ts';

const BIN = fileURLToPath(new URL('../../bin/tensorlink.js', import.meta.url));
const CLI_SRC = fileURLToPath(new URL('../../src/cli', import.meta.url));

function cli(...args: string[]) {
  const r = spawnSync(process.execPath, [BIN, ...args], { encoding: 'utf8', timeout: 60_000 });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** The options a help text lists: the names of its lines that start with `  --`. */
function listed(help: string): string[] {
  return [...help.matchAll(/^ {2}--([a-z0-9-]+)/gm)].map((m) => m[1]);
}

/** Where the CLI's code reads a flag: flags.name, flags['name'], intFlag(flags, 'name', …), requiredString(flags, 'name'). */
const READS = new RegExp([
  /\bflags\.([a-z][A-Za-z]*)\b(?!')/.source, /flags\['([a-z0-9-]+)'\]/.source, /[A-Za-z]+Flag\(flags, '([a-z0-9-]+)'/.source,
  /requiredString\(flags, '([a-z0-9-]+)'/.source,
].join('|'), 'g');

/** A value the option takes. */
function goodValue(option: OptionSpec): string[] {
  switch (option.kind) {
    case 'boolean': return [];
    case 'int': case 'number': return [String(option.min ?? 0)];
    case 'enum': return [option.choices![0]];
    case 'bytes': return ['1GiB'];
    case 'list': return ['a,b'];
    default: return ['x'];
  }
}

/** A value the option refuses, or null if it takes any. */
function badValue(option: OptionSpec): string | null {
  if (option.kind === 'int') return (option.min ?? 0) > 0 ? '0' : '1.5';
  if (option.kind === 'number') return 'lots';
  if (option.kind === 'enum') return 'nothing-like-it';
  if (option.kind === 'bytes') return 'big';
  return null;
}

const resolved: CommandSpec[] = await Promise.all(COMMANDS.map((c) => resolveCommand(c)));

describe('the CLI\'s declarations, its help and its parser agree', () => {
  test('every command\'s help lists exactly the options the parser accepts, each once; the overview lists every command', () => {
    for (const spec of resolved) {
      const options = acceptedOptions(spec);
      const help = commandHelp(spec);
      const names = listed(help);
      assert.deepEqual([...names].sort(), Object.keys(options).sort(), `${spec.name}: help vs declarations`);
      assert.equal(new Set(names).size, names.length, `${spec.name}: an option listed twice`);
      assert.deepEqual(Object.keys(parseArgsOptions(options)).sort(), Object.keys(options).sort(), `${spec.name}: parser vs declarations`);
      for (const [name, option] of Object.entries(options)) {
        assert.ok(option.help.length > 0, `${spec.name} --${name} has no help`);
        // the parser takes each option the help lists, with a value of its kind
        const { flags } = parseCommand(spec, [`--${name}`, ...goodValue(option)]);
        assert.notEqual(flags[name], undefined, `${spec.name} --${name}`);
        if (option.default !== undefined) assert.match(help, new RegExp(`default ${String(option.default).replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}`));
      }
    }
    const overview = overviewHelp();
    for (const spec of COMMANDS) assert.match(overview, new RegExp(`^ {2}${spec.name} `, 'm'));
  });

  test('a bad value is one UsageError naming the flag; --help shows the help whatever the values', () => {
    for (const spec of resolved) {
      for (const [name, option] of Object.entries(acceptedOptions(spec))) {
        const bad = badValue(option);
        if (bad === null) continue;
        assert.throws(() => parseCommand(spec, [`--${name}`, bad]), (err: Error) => {
          assert.equal(err.name, 'UsageError');
          assert.ok(err.message.startsWith(`--${name} `), err.message);
          assert.ok(!err.message.includes('\n'), err.message);
          return true;
        }, `${spec.name} --${name} ${bad}`);
        assert.equal(parseCommand(spec, [`--${name}`, bad, '--help']).flags.help, true);
      }
      assert.throws(() => parseCommand(spec, ['--frobnicate']), /takes no option --frobnicate/);
    }
  });

  test('every flag the CLI\'s code reads is declared by a command', () => {
    const declared = new Set(resolved.flatMap((s) => Object.keys(acceptedOptions(s))));
    const files = readdirSync(CLI_SRC, { recursive: true, encoding: 'utf8' }).filter((f) => f.endsWith('.ts'));
    const read = new Set<string>();
    for (const file of files) {
      const text = readFileSync(join(CLI_SRC, file), 'utf8');
      for (const m of text.matchAll(READS)) {
        read.add(m[1] ?? m[2] ?? m[3] ?? m[4]);
      }
    }
    for (const name of read) assert.ok(declared.has(name), `the CLI reads --${name}, which no command declares`);
    assert.ok(read.size > 40, `found ${read.size} flags read`);
  });

  test('a number the CLI\'s code falls back to for an option is a default some command declares for it', () => {
    const defaults = new Map<string, Set<string>>();
    for (const spec of resolved) {
      for (const [name, option] of Object.entries(acceptedOptions(spec))) {
        if (typeof option.default === 'number') defaults.set(name, (defaults.get(name) ?? new Set()).add(String(option.default)));
      }
    }
    // the commands' modules (args.ts's helpers read a value only when it is given)
    const files = readdirSync(CLI_SRC, { recursive: true, encoding: 'utf8' }).filter((f) => f.startsWith('commands') && f.endsWith('.ts'));
    let checked = 0;
    for (const file of files) {
      const text = readFileSync(join(CLI_SRC, file), 'utf8');
      for (const [, name, literal] of text.matchAll(/(?:int|number)Flag\(flags, '([a-z0-9-]+)', ([0-9.e-]+)\b/g)) {
        if (!defaults.has(name)) continue;
        checked++;
        assert.ok(defaults.get(name)!.has(String(Number(literal))), `${file}: --${name} falls back to ${literal}, declared ${[...defaults.get(name)!].join(' or ')}`);
      }
    }
    assert.ok(checked > 20, `checked ${checked} fallbacks`);
  });
});

describe('tensorlink --help and COMMAND --help, as the command prints them', () => {
  test('the overview; each command\'s help is the one generated from its declaration; an unknown flag is one line, exit 2', () => {
    const overview = cli('--help');
    assert.equal(overview.code, 0);
    assert.equal(overview.stdout, `${overviewHelp()}\n`);
    for (const spec of resolved) {
      const help = cli(spec.name, '--help');
      assert.equal(help.code, 0, help.stderr);
      assert.equal(help.stdout, `${commandHelp(spec)}\n`, spec.name);
      const unknown = cli(spec.name, '--frobnicate');
      assert.equal(unknown.code, 2, spec.name);
      assert.equal(unknown.stderr.trim().split('\n').length, 1, unknown.stderr);
      assert.match(unknown.stderr, new RegExp(`^tensorlink: ${spec.name} takes no option --frobnicate`));
      assert.doesNotMatch(unknown.stderr, /\n\s+at /, 'no stack trace');
    }
    for (const args of [['train', '--batch', '0'], ['generate', '--strategy', 'random'], ['worker', '--memory', 'lots'], ['init-model', '--arch', 'rnn']]) {
      const r = cli(...args);
      assert.equal(r.code, 2, args.join(' '));
      assert.equal(r.stderr.trim().split('\n').length, 1, r.stderr);
      assert.doesNotMatch(r.stderr, /\n\s+at /, 'no stack trace');
    }
  });
});
