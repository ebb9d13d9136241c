"""``is_arch_support_pdl``: SGLang's Triton attention backend asks it when it starts. False means no
programmatic dependent launch, which every architecture runs correctly."""


def is_arch_support_pdl() -> bool:
    return False
