"""The only layer that talks to the API server: apply desired objects, observe children, write status."""
