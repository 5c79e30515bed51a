"""API types of the custom resources (``pd.sglang-operator.io/v1alpha1``) and CRD generation."""
