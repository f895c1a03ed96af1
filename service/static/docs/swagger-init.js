// Swagger UI at /docs (service/docs_pages.py): this server's openapi.json, nothing from any other
// host. validatorUrl null: no badge asking validator.swagger.io about the document. "Authorize"
// takes the bearer token (when the server has VERSIQ_API_TOKENS) that "Try it out" then sends.
"use strict";
window.ui = SwaggerUIBundle({
  url: "openapi.json",
  dom_id: "#swagger-ui",
  validatorUrl: null,
  deepLinking: true,
  displayRequestDuration: true,
  presets: [SwaggerUIBundle.presets.apis],
  layout: "BaseLayout",
});
