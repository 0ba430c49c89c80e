//! # kvgate-sim — a fleet of vLLM-like pods in discrete time, with kvgate's router in the loop
