// The stylesheet the dashboard imports for its side effect (esbuild bundles it into app.css): a module with nothing in it.
declare module '*.css';
