/** dist/cli/main.js of `root` if it is there and no older than src/ (an installed package has no src/), else null. */
export function freshBuild(root: string): string | null;
