"""Loading weights: targets and heads from folders or the hub (`loading`), the offline default model
(`default_model`, from the `gguf_wheel`), and oneDNN pre-packed linears for fp32 CPU (`cpu_linear`)."""
