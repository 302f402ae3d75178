"""What every program of the project shares and neither the data nor the model owns:
storage (`files`: local paths and filesystem URLs, atomic writes, locks), fetching over
HTTP (`fetch`: resumed, verified, healed), a quiet start (`startup`) and the command-line
wrapper (`program`). Imports neither `tf_records` nor `txl_keras`."""
