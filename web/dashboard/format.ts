/** Numbers and names as the dashboard shows them. */

export const short = (peerId: string): string => `…${peerId.slice(-6)}`;

export function bytes(n: number): string {
  if (n >= 2 ** 30) return `${(n / 2 ** 30).toFixed(1)} GiB`;
  if (n >= 2 ** 20) return `${(n / 2 ** 20).toFixed(0)} MiB`;
  return `${(n / 1024).toFixed(0)} KiB`;
}

export function ago(ms: number): string {
  const s = Math.max(0, ms / 1000);
  if (s < 60) return `${s.toFixed(s < 10 ? 1 : 0)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

/** Token units (18 decimals, as decimal strings) as TLK. */
export function tlk(units: string | undefined): string {
  if (units === undefined) return '—';
  const v = BigInt(units);
  const whole = v / 10n ** 18n;
  const frac = ((v % 10n ** 18n) / 10n ** 15n).toString().padStart(3, '0').replace(/0+$/, '');
  return `${whole}${frac ? `.${frac}` : ''}`;
}

export function flops(n: number): string {
  const units = ['', 'k', 'M', 'G', 'T', 'P', 'E'];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) {
    n /= 1000;
    i++;
  }
  return `${n.toFixed(n < 10 ? 2 : n < 100 ? 1 : 0)} ${units[i]}FLOP`;
}

export const fixed = (n: number | undefined, digits: number): string => (n === undefined ? '—' : n.toFixed(digits));
