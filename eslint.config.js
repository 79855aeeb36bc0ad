// One tool for lint and format: ESLint with typescript-eslint (correctness) and
// @stylistic (layout). `npm run lint` checks, `npm run format` fixes.
import js from '@eslint/js';
import stylistic from '@stylistic/eslint-plugin';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['dist/', '.test-build/', 'node_modules/', 'bench/out/', '.scratch/'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  stylistic.configs.customize({ indent: 2, quotes: 'single', semi: true, braceStyle: '1tbs', arrowParens: true }),
  {
    languageOptions: { globals: { process: 'readonly', console: 'readonly', performance: 'readonly', URL: 'readonly' } },
    rules: {
      '@stylistic/max-len': ['error', { code: 140, ignoreUrls: true, ignoreStrings: true, ignoreTemplateLiterals: true }],
      '@stylistic/operator-linebreak': ['error', 'before'],
      '@typescript-eslint/no-non-null-assertion': 'off',
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_' }],
      'no-constant-condition': ['error', { checkLoops: false }],
    },
  },
  {
    // the dashboard and the /lend page (src/browser/) run in a browser
    files: ['web/**/*.ts', 'web/**/*.tsx', 'src/browser/**/*.ts'],
    languageOptions: { globals: { document: 'readonly', window: 'readonly', EventSource: 'readonly', MessageEvent: 'readonly' } },
    // table rows read best with their cells on one line
    rules: { '@stylistic/jsx-one-expression-per-line': 'off', '@stylistic/max-len': ['error', { code: 180, ignoreStrings: true }] },
  },
  {
    files: ['**/*.cjs'],
    languageOptions: { sourceType: 'commonjs', globals: { require: 'readonly', module: 'writable' } },
    rules: { '@typescript-eslint/no-require-imports': 'off' },
  },
);
