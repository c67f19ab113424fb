"""A Lightning ``Trainer`` for the framework jobs: one CPU device, one epoch,
and none of the logging, checkpointing, progress bar, model summary or
sanity-check loop that would add output and untimed steps to what the tests
measure. The jobs run as scripts, so they import this from their own folder.
"""


def quiet_trainer(**kw):
    import lightning as L

    settings = dict(
        max_epochs=1,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    settings.update(kw)
    return L.Trainer(**settings)
