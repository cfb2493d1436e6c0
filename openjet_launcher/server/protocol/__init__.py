"""Request and response models, one module per API surface (the serving logic lives beside, in server/)."""
