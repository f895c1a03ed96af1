// Redoc at /redoc (service/docs_pages.py): this server's openapi.json, in the system's fonts
// (Redoc's own, Montserrat and Roboto, would come from Google Fonts: never loaded here).
"use strict";
const SANS = 'system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif';
const MONO = 'ui-monospace, SFMono-Regular, Menlo, Consolas, "Liberation Mono", monospace';
Redoc.init("openapi.json", {
  expandResponses: "200",
  theme: {
    typography: {
      fontFamily: SANS,
      headings: { fontFamily: SANS },
      code: { fontFamily: MONO },
    },
  },
}, document.getElementById("redoc"));
