import { useEffect, useRef } from 'preact/hooks';
import uPlot from 'uplot';

/** A line over steps (uPlot, on a canvas): a job's loss or tokens per second. */
export function Chart(props: { label: string; xs: number[]; ys: (number | null)[]; color: string; testId?: string }) {
  const box = useRef<HTMLDivElement>(null);
  const plot = useRef<uPlot | null>(null);
  useEffect(() => {
    if (!box.current) return;
    const axis = { stroke: '#9aa4b2', grid: { stroke: '#2a3140', width: 1 }, ticks: { stroke: '#2a3140' } };
    plot.current = new uPlot({
      width: 380,
      height: 170,
      legend: { show: false },
      cursor: { show: false },
      scales: { x: { time: false } },
      axes: [{ ...axis, label: 'step' }, { ...axis, size: 56 }],
      series: [{ label: 'step' }, { label: props.label, stroke: props.color, width: 2, points: { show: props.xs.length < 30 } }],
    }, [props.xs, props.ys], box.current);
    return () => {
      plot.current?.destroy();
      plot.current = null;
    };
  }, []);
  useEffect(() => {
    plot.current?.setData([props.xs, props.ys]);
  }, [props.xs, props.ys]);
  return (
    <figure class="chart" data-testid={props.testId}>
      <figcaption>{props.label}</figcaption>
      <div ref={box} />
    </figure>
  );
}
