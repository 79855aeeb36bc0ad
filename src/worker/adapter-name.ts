import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { basename, join } from 'node:path';

/**
 * The GPU a worker computes on, as this machine reports it: onnxruntime-node's WebGPU provider does not say which
 * adapter it chose, so this reads what the Vulkan loader is pointed at and what the kernel lists: SwiftShader or
 * lavapipe where VK_ICD_FILENAMES names them, an NVIDIA GPU's model from its driver (/proc/driver/nvidia), else the first display
 * device's PCI vendor and device ids (/sys/class/drm). Where it finds nothing it says so.
 * @example
 * adapterName() // 'NVIDIA H100 80GB HBM3', or 'SwiftShader (Vulkan in software)'
 */
export function adapterName(env: NodeJS.ProcessEnv = process.env): string {
  const icd = env.VK_ICD_FILENAMES ?? env.VK_DRIVER_FILES;
  if (icd && /swiftshader/i.test(icd)) return 'SwiftShader (Vulkan in software)';
  if (icd && /lvp|lavapipe/i.test(icd)) return 'lavapipe (Vulkan in software)';
  const nvidia = '/proc/driver/nvidia/gpus';
  for (const bus of list(nvidia)) {
    const model = read(join(nvidia, bus, 'information'))?.match(/^Model:\s*(.+)$/m)?.[1]?.trim();
    if (model) return model.slice(0, 128);
  }
  const drm = '/sys/class/drm';
  for (const card of list(drm).filter((c) => /^card\d+$/.test(c))) {
    const vendor = read(join(drm, card, 'device', 'vendor'))?.trim();
    const device = read(join(drm, card, 'device', 'device'))?.trim();
    if (vendor) return `${VENDORS[vendor] ?? 'GPU'} (PCI ${vendor.replace('0x', '')}:${(device ?? '').replace('0x', '')})`;
  }
  if (icd) return `unknown (Vulkan driver ${basename(icd)})`;
  return 'unknown';
}

const VENDORS: Readonly<Record<string, string>> = { '0x10de': 'NVIDIA', '0x1002': 'AMD', '0x8086': 'Intel', '0x13b5': 'ARM', '0x5143': 'Qualcomm' };

const list = (dir: string): string[] => (existsSync(dir) ? readdirSync(dir).sort() : []);

function read(file: string): string | null {
  try {
    return readFileSync(file, 'utf8');
  } catch {
    return null;
  }
}
