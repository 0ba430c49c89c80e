//! Engine model of one vLLM-like pod (to be implemented).
