"""EnvACE Studio: the Gradio app. Importing this package never imports torch."""
