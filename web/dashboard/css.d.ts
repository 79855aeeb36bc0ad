// Stylesheets the dashboard imports for their side effect (esbuild bundles them into app.css): modules with nothing in them.
declare module '*.css';
